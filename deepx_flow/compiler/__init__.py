"""The graph compiler: pure passes from a graph to an executable, chunked plan."""
