"""One module per program; the module name is the asset key and the output path segment."""
