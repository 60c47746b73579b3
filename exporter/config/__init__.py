"""The strict YAML configuration and its located errors."""
