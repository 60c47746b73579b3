"""The running exporter: targets, scrape loop, window book, the stop's work."""
