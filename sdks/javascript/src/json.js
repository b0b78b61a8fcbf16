// JSON as the gateway reads it. JSON.stringify writes -0 as 0, which would change a graph's
// literal (x + -0.0 is not x + 0.0 where x is -0.0): -0 is written as -0.0, as Python does.

const NEGATIVE_ZERO = "\u0000-0\u0000"; // (a marker no string of a graph holds)

/** `value` as JSON text, -0 kept. */
export function toJson(value) {
  const text = JSON.stringify(value, (_, v) => (Object.is(v, -0) ? NEGATIVE_ZERO : v));
  return text.replaceAll(JSON.stringify(NEGATIVE_ZERO), "-0.0");
}
