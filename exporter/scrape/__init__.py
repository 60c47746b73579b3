"""Reading from the outside over HTTP: scrapes of targets, service discovery."""
