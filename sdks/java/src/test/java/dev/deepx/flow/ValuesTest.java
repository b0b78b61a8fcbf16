package dev.deepx.flow;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.math.BigInteger;
import org.junit.jupiter.api.Test;

/** Values cross as little-endian bytes, exactly, and a value a dtype would change is refused. */
class ValuesTest {
  private static Values roundTrip(Values v) {
    byte[] raw = v.toBytes();
    return Values.fromBytes(v.dtype(), v.shape(), raw, 0, raw.length);
  }

  @Test
  void everyDtypeCrossesAsBytesExactly() {
    Values[] all = {
      Values.of(new boolean[] {true, false}), Values.of(new byte[] {-128, 127}),
      Values.of(new short[] {-32768, 32767}), Values.of(new int[] {Integer.MIN_VALUE, 7}),
      Values.of(new long[] {(1L << 62) + 1, Long.MIN_VALUE}),
      new Values("uint8", new int[] {2}, new short[] {0, 255}),
      new Values("uint16", new int[] {2}, new int[] {0, 65535}),
      new Values("uint32", new int[] {2}, new long[] {0, 4294967295L}),
      new Values("uint64", new int[] {2}, new long[] {-1L, 1L}),
      new Values("float16", new int[] {2}, new short[] {0x3c00, (short) 0xfc00}),
      new Values("bfloat16", new int[] {2}, new short[] {0x3f80, (short) 0x8000}),
      Values.of(new float[] {-0.0f, Float.NaN, Float.MIN_VALUE, Float.MAX_VALUE}, 2, 2),
      Values.of(new double[] {Double.NEGATIVE_INFINITY, -0.0}),
    };
    for (Values v : all) {
      Values back = roundTrip(v);
      assertEquals(v.toString(), back.toString());
      assertArrayEquals(v.shape(), back.shape());
    }
    assertArrayEquals(new byte[] {1, 0, 0, 0, 0, 0, 0, 0x40}, Values.of(new long[] {(1L << 62) + 1}).toBytes());
    assertArrayEquals(new byte[] {(byte) 255, 0}, new Values("uint8", new int[] {2}, new short[] {255, 0}).toBytes());
  }

  @Test
  void aValueTheDtypeWouldChangeIsRefused() {
    DeepxException e = assertThrows(DeepxException.class, () -> Values.of(new float[] {1, 2}, 3));
    assertEquals("2 values, but shape [3] holds 3", e.getMessage());
    assertEquals("InputError", e.kind());
    e = assertThrows(DeepxException.class, () -> new Values("int32", new int[] {1}, new float[] {1}));
    assertEquals("dtype int32 holds int[], not float[]", e.getMessage());
    e = assertThrows(DeepxException.class, () -> new Values("uint8", new int[] {1}, new short[] {256}));
    assertEquals("256 is not a uint8 value", e.getMessage());
    e = assertThrows(DeepxException.class, () -> new Values("uint32", new int[] {1}, new long[] {-1}));
    assertEquals("-1 is not a uint32 value", e.getMessage());
    e = assertThrows(DeepxException.class, () -> new Values("float8", new int[] {1}, new short[] {1}));
    assertEquals("unknown dtype 'float8'", e.getMessage());
    assertThrows(DeepxException.class, () -> Values.of(new int[] {1}).floats());
  }

  @Test
  void sixteenBitFloatsConvertAndUint64ReadsWithoutItsSign() {
    Values half = new Values("float16", new int[] {5}, new short[] {0x3c00, (short) 0xc000, 0x0001,
        0x7c00, 0x7e00});
    assertArrayEquals(new float[] {1, -2, (float) Math.pow(2, -24), Float.POSITIVE_INFINITY, Float.NaN},
        half.toFloat32());
    Values brain = new Values("bfloat16", new int[] {2}, new short[] {0x3f80, 0x4049});
    assertArrayEquals(new float[] {1, 3.140625f}, brain.toFloat32());
    Values big = new Values("uint64", new int[] {2}, new long[] {-1L, 5});
    assertArrayEquals(new BigInteger[] {new BigInteger("18446744073709551615"), BigInteger.valueOf(5)},
        big.toBigIntegers());
    assertThrows(DeepxException.class, () -> Values.of(new float[] {1}).toFloat32());
  }
}
