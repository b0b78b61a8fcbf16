package dev.deepx.flow;

import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.Map;

/**
 * A tensor's values: its shape, dtype and a flat, row-major Java array of the dtype's type.
 * They travel as the protocol's little-endian binary data, so every dtype crosses exactly.
 *
 * <table>
 *   <caption>dtype: Java array</caption>
 *   <tr><td>float32, float64</td><td>float[], double[]</td></tr>
 *   <tr><td>int8, int16, int32, int64</td><td>byte[], short[], int[], long[]</td></tr>
 *   <tr><td>uint8, uint16, uint32</td><td>short[], int[], long[] (the next wider type; a value
 *   out of the dtype's range is refused)</td></tr>
 *   <tr><td>uint64</td><td>long[] of the 64-bit patterns ({@link #toBigIntegers()} gives the
 *   values; Long.toUnsignedString one)</td></tr>
 *   <tr><td>bool</td><td>boolean[]</td></tr>
 *   <tr><td>float16, bfloat16</td><td>short[] of the 16-bit patterns ({@link #toFloat32()}
 *   converts)</td></tr>
 * </table>
 */
public final class Values {
  /** dtype: the protocol's datatype. */
  static final Map<String, String> WIRE = Map.ofEntries(Map.entry("bool", "BOOL"),
      Map.entry("int8", "INT8"), Map.entry("int16", "INT16"), Map.entry("int32", "INT32"),
      Map.entry("int64", "INT64"), Map.entry("uint8", "UINT8"), Map.entry("uint16", "UINT16"),
      Map.entry("uint32", "UINT32"), Map.entry("uint64", "UINT64"),
      Map.entry("float16", "FP16"), Map.entry("bfloat16", "BF16"),
      Map.entry("float32", "FP32"), Map.entry("float64", "FP64"));
  /** dtype: the Java array holding its values. */
  private static final Map<String, Class<?>> ARRAY = Map.ofEntries(
      Map.entry("bool", boolean[].class), Map.entry("int8", byte[].class),
      Map.entry("int16", short[].class), Map.entry("int32", int[].class),
      Map.entry("int64", long[].class), Map.entry("uint8", short[].class),
      Map.entry("uint16", int[].class), Map.entry("uint32", long[].class),
      Map.entry("uint64", long[].class), Map.entry("float16", short[].class),
      Map.entry("bfloat16", short[].class), Map.entry("float32", float[].class),
      Map.entry("float64", double[].class));
  /** dtype: bytes per value on the wire. */
  private static final Map<String, Integer> WIDTH = Map.ofEntries(Map.entry("bool", 1),
      Map.entry("int8", 1), Map.entry("int16", 2), Map.entry("int32", 4),
      Map.entry("int64", 8), Map.entry("uint8", 1), Map.entry("uint16", 2),
      Map.entry("uint32", 4), Map.entry("uint64", 8), Map.entry("float16", 2),
      Map.entry("bfloat16", 2), Map.entry("float32", 4), Map.entry("float64", 8));

  private final String dtype;
  private final int[] shape;
  private final Object data;

  /**
   * Values of {@code dtype} and {@code shape} held by {@code data}, an array of the dtype's
   * Java type (see the class's table); the wrong type, a length the shape does not hold, or an
   * unsigned value out of its dtype's range is refused (InputError), not converted.
   */
  public Values(String dtype, int[] shape, Object data) {
    Class<?> want = ARRAY.get(dtype);
    if (want == null) {
      throw new DeepxException("InputError", "unknown dtype " + Spelling.shown(dtype));
    }
    if (data == null || data.getClass() != want) {
      throw new DeepxException("InputError", "dtype " + dtype + " holds " + want.getSimpleName()
          + ", not " + (data == null ? "null" : data.getClass().getSimpleName()));
    }
    int count = java.lang.reflect.Array.getLength(data);
    if (shape == null || Arrays.stream(shape).anyMatch(d -> d < 0)) {
      throw new DeepxException("InputError", "a shape is a list of non-negative integers, not "
          + Arrays.toString(shape));
    }
    if (count != size(shape)) {
      throw new DeepxException("InputError", count + " values, but shape "
          + Arrays.toString(shape) + " holds " + size(shape));
    }
    long top = dtype.equals("uint8") ? 0xffL : dtype.equals("uint16") ? 0xffffL : 0xffffffffL;
    if (dtype.equals("uint8") || dtype.equals("uint16") || dtype.equals("uint32")) {
      for (int i = 0; i < count; i++) {
        long v = java.lang.reflect.Array.getLong(data, i);
        if (v < 0 || v > top) {
          throw new DeepxException("InputError", v + " is not a " + dtype + " value");
        }
      }
    }
    this.dtype = dtype;
    this.shape = shape.clone();
    this.data = data;
  }

  /** float32 values; no shape: one axis of their length. */
  public static Values of(float[] data, int... shape) {
    return new Values("float32", shapeOr(shape, data.length), data);
  }

  /** float64 values; no shape: one axis of their length. */
  public static Values of(double[] data, int... shape) {
    return new Values("float64", shapeOr(shape, data.length), data);
  }

  /** int8 values; no shape: one axis of their length. */
  public static Values of(byte[] data, int... shape) {
    return new Values("int8", shapeOr(shape, data.length), data);
  }

  /** int16 values; no shape: one axis of their length. */
  public static Values of(short[] data, int... shape) {
    return new Values("int16", shapeOr(shape, data.length), data);
  }

  /** int32 values; no shape: one axis of their length. */
  public static Values of(int[] data, int... shape) {
    return new Values("int32", shapeOr(shape, data.length), data);
  }

  /** int64 values; no shape: one axis of their length. */
  public static Values of(long[] data, int... shape) {
    return new Values("int64", shapeOr(shape, data.length), data);
  }

  /** bool values; no shape: one axis of their length. */
  public static Values of(boolean[] data, int... shape) {
    return new Values("bool", shapeOr(shape, data.length), data);
  }

  private static int[] shapeOr(int[] shape, int length) {
    return shape.length == 0 ? new int[] {length} : shape;
  }

  static int size(int[] shape) {
    int n = 1;
    for (int d : shape) {
      n *= d;
    }
    return n;
  }

  public String dtype() {
    return dtype;
  }

  public int[] shape() {
    return shape.clone();
  }

  /** The values: an array of the dtype's Java type (see the class's table). */
  public Object data() {
    return data;
  }

  /** The number of values. */
  public int size() {
    return size(shape);
  }

  private <T> T as(Class<T> kind) {
    if (!kind.isInstance(data)) {
      throw new DeepxException("InputError", dtype + " values are a "
          + data.getClass().getSimpleName() + ", not a " + kind.getSimpleName());
    }
    return kind.cast(data);
  }

  /** float32's values. */
  public float[] floats() {
    return as(float[].class);
  }

  /** float64's values. */
  public double[] doubles() {
    return as(double[].class);
  }

  /** int8's values. */
  public byte[] bytes() {
    return as(byte[].class);
  }

  /** int16's and uint8's values, and float16's and bfloat16's bit patterns. */
  public short[] shorts() {
    return as(short[].class);
  }

  /** int32's and uint16's values. */
  public int[] ints() {
    return as(int[].class);
  }

  /** int64's and uint32's values, and uint64's bit patterns. */
  public long[] longs() {
    return as(long[].class);
  }

  /** bool's values. */
  public boolean[] booleans() {
    return as(boolean[].class);
  }

  /** The values of an int64 or uint64 tensor as BigIntegers (uint64's without their sign). */
  public BigInteger[] toBigIntegers() {
    if (!dtype.equals("int64") && !dtype.equals("uint64")) {
      throw new DeepxException("InputError", dtype + " is not a 64-bit integer");
    }
    long[] v = longs();
    BigInteger[] out = new BigInteger[v.length];
    for (int i = 0; i < v.length; i++) {
      out[i] = dtype.equals("uint64") ? new BigInteger(Long.toUnsignedString(v[i]))
          : BigInteger.valueOf(v[i]);
    }
    return out;
  }

  /** The 16-bit patterns of a float16 or bfloat16 tensor as float32 values. */
  public float[] toFloat32() {
    if (!dtype.equals("float16") && !dtype.equals("bfloat16")) {
      throw new DeepxException("InputError", dtype + " is not a 16-bit float");
    }
    short[] bits = shorts();
    float[] out = new float[bits.length];
    for (int i = 0; i < bits.length; i++) {
      out[i] = dtype.equals("bfloat16") ? Float.intBitsToFloat((bits[i] & 0xffff) << 16)
          : halfToFloat(bits[i] & 0xffff);
    }
    return out;
  }

  private static float halfToFloat(int b) {
    double sign = (b & 0x8000) != 0 ? -1 : 1;
    int exponent = (b >> 10) & 0x1f;
    double fraction = b & 0x3ff;
    if (exponent == 0) {
      return (float) (sign * Math.scalb(fraction / 1024, -14));
    }
    if (exponent == 31) {
      return fraction != 0 ? Float.NaN : (float) (sign * Double.POSITIVE_INFINITY);
    }
    return (float) (sign * Math.scalb(1 + fraction / 1024, exponent - 15));
  }

  /** The values' little-endian bytes (the protocol's binary data). */
  byte[] toBytes() {
    int n = size();
    ByteBuffer out = ByteBuffer.allocate(n * WIDTH.get(dtype)).order(ByteOrder.LITTLE_ENDIAN);
    switch (dtype) {
      case "bool" -> {
        for (boolean v : (boolean[]) data) {
          out.put((byte) (v ? 1 : 0));
        }
      }
      case "int8" -> out.put((byte[]) data);
      case "uint8" -> {
        for (short v : (short[]) data) {
          out.put((byte) v);
        }
      }
      case "int16", "float16", "bfloat16" -> out.asShortBuffer().put((short[]) data);
      case "uint16" -> {
        for (int v : (int[]) data) {
          out.putShort((short) v);
        }
      }
      case "int32" -> out.asIntBuffer().put((int[]) data);
      case "uint32" -> {
        for (long v : (long[]) data) {
          out.putInt((int) v);
        }
      }
      case "int64", "uint64" -> out.asLongBuffer().put((long[]) data);
      case "float32" -> out.asFloatBuffer().put((float[]) data);
      default -> out.asDoubleBuffer().put((double[]) data);
    }
    return out.array();
  }

  /** Values of {@code dtype} and {@code shape} from their little-endian bytes. */
  static Values fromBytes(String dtype, int[] shape, byte[] raw, int offset, int length) {
    Integer width = WIDTH.get(dtype);
    int n = size(shape);
    if (width == null || (long) n * width != length) {
      throw new DeepxException("RemoteError", "the gateway sent " + length + " bytes for "
          + dtype + Arrays.toString(shape));
    }
    ByteBuffer in = ByteBuffer.wrap(raw, offset, length).slice().order(ByteOrder.LITTLE_ENDIAN);
    Object data = java.lang.reflect.Array.newInstance(ARRAY.get(dtype).getComponentType(), n);
    switch (dtype) {
      case "bool" -> {
        for (int i = 0; i < n; i++) {
          ((boolean[]) data)[i] = in.get() != 0;
        }
      }
      case "int8" -> in.get((byte[]) data);
      case "uint8" -> {
        for (int i = 0; i < n; i++) {
          ((short[]) data)[i] = (short) (in.get() & 0xff);
        }
      }
      case "int16", "float16", "bfloat16" -> in.asShortBuffer().get((short[]) data);
      case "uint16" -> {
        for (int i = 0; i < n; i++) {
          ((int[]) data)[i] = in.getShort() & 0xffff;
        }
      }
      case "int32" -> in.asIntBuffer().get((int[]) data);
      case "uint32" -> {
        for (int i = 0; i < n; i++) {
          ((long[]) data)[i] = in.getInt() & 0xffffffffL;
        }
      }
      case "int64", "uint64" -> in.asLongBuffer().get((long[]) data);
      case "float32" -> in.asFloatBuffer().get((float[]) data);
      default -> in.asDoubleBuffer().get((double[]) data);
    }
    return new Values(dtype, shape, data);
  }

  @Override
  public String toString() {
    String shown = switch (data.getClass().getSimpleName()) {
      case "boolean[]" -> Arrays.toString((boolean[]) data);
      case "byte[]" -> Arrays.toString((byte[]) data);
      case "short[]" -> Arrays.toString((short[]) data);
      case "int[]" -> Arrays.toString((int[]) data);
      case "long[]" -> Arrays.toString((long[]) data);
      case "float[]" -> Arrays.toString((float[]) data);
      default -> Arrays.toString((double[]) data);
    };
    return "Values(" + dtype + Arrays.toString(shape) + ", " + shown + ")";
  }
}
