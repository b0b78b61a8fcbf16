// Error, and Python's difflib ratio for "did you mean" (as Closest in the Go SDK).
#include "deepx/error.hpp"

#include <algorithm>
#include <map>

namespace deepx {

namespace {

std::string described(const std::string& message, const std::string& node) {
  return node.empty() ? message : "node " + shown(node) + ": " + message;
}

// Code points of UTF-8 text (difflib compares characters, not bytes).
std::u32string decoded(const std::string& text) {
  std::u32string out;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    int more = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    char32_t point = more == 0 ? c : c & (0x3f >> more);
    for (int k = 1; k <= more && i + k < text.size(); k++) {
      point = (point << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    }
    out.push_back(point);
    i += more + 1;
  }
  return out;
}

struct Match {
  size_t i, j, k;
};

// Ratcliff/Obershelp, as difflib.SequenceMatcher finds its longest matching block.
Match longest_match(const std::u32string& a, const std::u32string& b, size_t alo, size_t ahi,
                    size_t blo, size_t bhi) {
  Match best{alo, blo, 0};
  std::map<size_t, size_t> lengths;  // (j + 1 -> the length of the match ending at j)
  for (size_t i = alo; i < ahi; i++) {
    std::map<size_t, size_t> next;
    for (size_t j = blo; j < bhi; j++) {
      if (a[i] != b[j]) continue;
      auto before = lengths.find(j);
      size_t k = (before == lengths.end() ? 0 : before->second) + 1;
      next[j + 1] = k;
      if (k > best.k) best = {i - k + 1, j - k + 1, k};
    }
    lengths = std::move(next);
  }
  return best;
}

size_t matched(const std::u32string& a, const std::u32string& b, size_t alo, size_t ahi,
               size_t blo, size_t bhi) {
  Match m = longest_match(a, b, alo, ahi, blo, bhi);
  if (m.k == 0) return 0;
  size_t total = m.k;
  if (alo < m.i && blo < m.j) total += matched(a, b, alo, m.i, blo, m.j);
  if (m.i + m.k < ahi && m.j + m.k < bhi) total += matched(a, b, m.i + m.k, ahi, m.j + m.k, bhi);
  return total;
}

double ratio(const std::string& first, const std::string& second) {
  std::u32string a = decoded(first), b = decoded(second);
  if (a.size() + b.size() == 0) return 1;
  return 2.0 * static_cast<double>(matched(a, b, 0, a.size(), 0, b.size())) /
         static_cast<double>(a.size() + b.size());
}

std::string lowered(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

Error::Error(std::string kind, std::string message, int status, std::string node)
    : std::runtime_error(described(message, node)),
      kind_(std::move(kind)),
      message_(std::move(message)),
      node_(std::move(node)),
      status_(status) {}

std::string shown(const std::string& text) { return "'" + text + "'"; }

std::string closest(const std::string& word, const std::vector<std::string>& choices) {
  std::map<std::string, std::string> spelled;  // lower-cased -> the first choice spelled so
  std::vector<std::string> order;
  for (const auto& choice : choices) {
    if (spelled.emplace(lowered(choice), choice).second) order.push_back(lowered(choice));
  }
  double best_score = -1;
  std::string best;
  std::string target = lowered(word);
  for (const auto& candidate : order) {
    double score = ratio(candidate, target);
    if (score < 0.6) continue;
    // (ties: difflib keeps the largest (score, word) pair)
    if (score > best_score || (score == best_score && candidate > best)) {
      best_score = score;
      best = candidate;
    }
  }
  return best.empty() ? "" : spelled[best];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& choices) {
  std::string close = closest(word, choices);
  return close.empty() ? "" : " (did you mean " + shown(close) + "?)";
}

}  // namespace deepx
