// Errors of the SDK and of the gateway, and the "did you mean" of their messages: the same
// words as Python's (deepx_flow/errors.py), so a mistake reads alike in every language.

/** A deepx_flow error: `kind` names it as Python does (GraphError, InputError, NotFound,
 * ...), `status` is the gateway's HTTP status where it came from one, `node` the node it is
 * about where it is about one. */
export class DeepxError extends Error {
  constructor(message, { kind = "DeepxError", status = undefined, node = undefined } = {}) {
    super(node === undefined ? message : `node ${shown(node)}: ${message}`);
    this.name = "DeepxError";
    this.kind = kind;
    this.status = status;
    this.node = node;
  }
}

/** A value as Python's `repr` shows it in messages ('text', 3, None). */
export function shown(value) {
  if (typeof value === "string") return `'${value}'`;
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  return String(value);
}

// Ratcliff/Obershelp similarity, as Python's difflib.SequenceMatcher.ratio() computes it
// (no junk: the words compared are short).
function longestMatch(a, b, alo, ahi, blo, bhi) {
  let best = [alo, blo, 0];
  let lengths = new Map();
  for (let i = alo; i < ahi; i++) {
    const next = new Map();
    for (let j = blo; j < bhi; j++) {
      if (a[i] !== b[j]) continue;
      const k = (lengths.get(j - 1) || 0) + 1;
      next.set(j, k);
      if (k > best[2]) best = [i - k + 1, j - k + 1, k];
    }
    lengths = next;
  }
  return best;
}

function matched(a, b, alo, ahi, blo, bhi) {
  const [i, j, k] = longestMatch(a, b, alo, ahi, blo, bhi);
  if (k === 0) return 0;
  return k + (alo < i && blo < j ? matched(a, b, alo, i, blo, j) : 0) +
    (i + k < ahi && j + k < bhi ? matched(a, b, i + k, ahi, j + k, bhi) : 0);
}

function ratio(a, b) {
  const total = a.length + b.length;
  return total === 0 ? 1 : (2 * matched(a, b, 0, a.length, 0, b.length)) / total;
}

/** The choice spelled most like `word` (case ignored; a ratio of at least 0.6), or
 * undefined: Python's `errors.closest`. */
export function closest(word, choices) {
  const lowered = new Map();
  for (const choice of choices) if (!lowered.has(choice.toLowerCase())) {
    lowered.set(choice.toLowerCase(), choice);
  }
  let best;
  const target = String(word).toLowerCase();
  for (const candidate of lowered.keys()) {
    const score = ratio(candidate, target);
    if (score < 0.6) continue;
    // (ties: difflib keeps the largest (score, word) pair)
    if (best === undefined || score > best[0] || (score === best[0] && candidate > best[1])) {
      best = [score, candidate];
    }
  }
  return best === undefined ? undefined : lowered.get(best[1]);
}

/** " (did you mean 'relu'?)", or "" where no choice is close. */
export function didYouMean(word, choices) {
  const close = closest(word, choices);
  return close === undefined ? "" : ` (did you mean ${shown(close)}?)`;
}
