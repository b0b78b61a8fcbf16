package dev.deepx.flow;

import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;

/**
 * The words of messages as Python's (deepx_flow/errors.py): values as its repr shows them,
 * and "did you mean" from difflib's ratio, so a mistake reads alike in every language.
 */
public final class Spelling {
  private Spelling() {}

  /** A value as Python's repr shows it in messages ('text', 3, None, True). */
  public static String shown(Object value) {
    if (value instanceof String) {
      return "'" + value + "'";
    }
    if (value == null) {
      return "None";
    }
    if (value instanceof Boolean) {
      return (Boolean) value ? "True" : "False";
    }
    return String.valueOf(value);
  }

  // Ratcliff/Obershelp similarity, as Python's difflib.SequenceMatcher.ratio() computes it
  // (no junk: the words compared are short).
  private static int[] longestMatch(int[] a, int[] b, int alo, int ahi, int blo, int bhi) {
    int bi = alo;
    int bj = blo;
    int bk = 0;
    Map<Integer, Integer> lengths = new LinkedHashMap<>();
    for (int i = alo; i < ahi; i++) {
      Map<Integer, Integer> next = new LinkedHashMap<>();
      for (int j = blo; j < bhi; j++) {
        if (a[i] != b[j]) {
          continue;
        }
        int k = lengths.getOrDefault(j - 1, 0) + 1;
        next.put(j, k);
        if (k > bk) {
          bi = i - k + 1;
          bj = j - k + 1;
          bk = k;
        }
      }
      lengths = next;
    }
    return new int[] {bi, bj, bk};
  }

  private static int matched(int[] a, int[] b, int alo, int ahi, int blo, int bhi) {
    int[] m = longestMatch(a, b, alo, ahi, blo, bhi);
    int i = m[0];
    int j = m[1];
    int k = m[2];
    if (k == 0) {
      return 0;
    }
    int total = k;
    if (alo < i && blo < j) {
      total += matched(a, b, alo, i, blo, j);
    }
    if (i + k < ahi && j + k < bhi) {
      total += matched(a, b, i + k, ahi, j + k, bhi);
    }
    return total;
  }

  static double ratio(String a, String b) {
    int[] ra = a.codePoints().toArray();
    int[] rb = b.codePoints().toArray();
    if (ra.length + rb.length == 0) {
      return 1;
    }
    return 2.0 * matched(ra, rb, 0, ra.length, 0, rb.length) / (ra.length + rb.length);
  }

  /**
   * The choice spelled most like {@code word} (case ignored; a ratio of at least 0.6), or null:
   * Python's errors.closest.
   */
  public static String closest(String word, Collection<String> choices) {
    Map<String, String> lowered = new LinkedHashMap<>();
    for (String c : choices) {
      lowered.putIfAbsent(c.toLowerCase(Locale.ROOT), c);
    }
    String target = word.toLowerCase(Locale.ROOT);
    double bestScore = -1;
    String best = null;
    for (String candidate : lowered.keySet()) {
      double score = ratio(candidate, target);
      if (score < 0.6) {
        continue;
      }
      // (ties: difflib keeps the largest (score, word) pair)
      if (score > bestScore || (score == bestScore && candidate.compareTo(best) > 0)) {
        bestScore = score;
        best = candidate;
      }
    }
    return best == null ? null : lowered.get(best);
  }

  /** " (did you mean 'relu'?)", or "" where no choice is close. */
  static String didYouMean(String word, Collection<String> choices) {
    String c = closest(word, choices);
    return c == null ? "" : " (did you mean " + shown(c) + "?)";
  }
}
