"""The settings layer: a head's frozen configuration (config) and the command-line options made from it (options)."""
