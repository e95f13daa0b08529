"""User-facing tools on top of the device: op tracker, logging, command line."""
