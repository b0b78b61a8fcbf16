package dev.deepx.flow;

/**
 * A deepx_flow error: {@link #kind()} names it as Python does (GraphError, SpecError,
 * InputError, NotFound, ...), {@link #status()} is the gateway's HTTP status where it came from
 * one (else 0), {@link #node()} the node it is about where it is about one. The message is
 * Python's: {@code node 'y': unknown operator 'relux' (did you mean 'relu'?) ...}.
 */
public class DeepxException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String kind;
  private final int status;
  private final String node;

  public DeepxException(String kind, String message, int status, String node) {
    super(node == null ? message : "node " + Spelling.shown(node) + ": " + message);
    this.kind = kind;
    this.status = status;
    this.node = node;
  }

  public DeepxException(String kind, String message) {
    this(kind, message, 0, null);
  }

  static DeepxException graph(String node, String message) {
    return new DeepxException("GraphError", message, 0, node);
  }

  public String kind() {
    return kind;
  }

  public int status() {
    return status;
  }

  public String node() {
    return node;
  }
}
