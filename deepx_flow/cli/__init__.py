"""The `deepx-flow` command line."""
