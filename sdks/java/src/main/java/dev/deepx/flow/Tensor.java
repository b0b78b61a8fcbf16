package dev.deepx.flow;

/** One node of a {@link Graph}: an input, or an operator applied to tensors and literals. */
public final class Tensor {
  final Graph graph;
  private final String id;
  private final String op;

  Tensor(Graph graph, String id, String op) {
    this.graph = graph;
    this.id = id;
    this.op = op;
  }

  /** The node's id in the spec. */
  public String id() {
    return id;
  }

  /** The node's operator ("input" for an input). */
  public String op() {
    return op;
  }

  @Override
  public String toString() {
    return "<Tensor " + id + " (" + op + ")>";
  }
}
