package deepx

import (
	"fmt"
	"strings"
)

// Error is a deepx_flow error: Kind names it as Python does (GraphError, InputError,
// NotFound, ...), Status is the gateway's HTTP status where it came from one, Node the node
// it is about where it is about one.
type Error struct {
	Kind    string
	Message string
	Status  int
	Node    string
}

func (e *Error) Error() string {
	if e.Node != "" {
		return fmt.Sprintf("node %s: %s", shown(e.Node), e.Message)
	}
	return e.Message
}

func graphError(node, format string, args ...any) *Error {
	return &Error{Kind: "GraphError", Message: fmt.Sprintf(format, args...), Node: node}
}

// shown is a value as Python's repr shows it in messages.
func shown(value any) string {
	switch v := value.(type) {
	case string:
		return "'" + v + "'"
	case nil:
		return "None"
	case bool:
		if v {
			return "True"
		}
		return "False"
	}
	return fmt.Sprint(value)
}

// Ratcliff/Obershelp similarity, as Python's difflib.SequenceMatcher.ratio() computes it.
func longestMatch(a, b []rune, alo, ahi, blo, bhi int) (int, int, int) {
	bi, bj, bk := alo, blo, 0
	lengths := map[int]int{}
	for i := alo; i < ahi; i++ {
		next := map[int]int{}
		for j := blo; j < bhi; j++ {
			if a[i] != b[j] {
				continue
			}
			k := lengths[j-1] + 1
			next[j] = k
			if k > bk {
				bi, bj, bk = i-k+1, j-k+1, k
			}
		}
		lengths = next
	}
	return bi, bj, bk
}

func matched(a, b []rune, alo, ahi, blo, bhi int) int {
	i, j, k := longestMatch(a, b, alo, ahi, blo, bhi)
	if k == 0 {
		return 0
	}
	total := k
	if alo < i && blo < j {
		total += matched(a, b, alo, i, blo, j)
	}
	if i+k < ahi && j+k < bhi {
		total += matched(a, b, i+k, ahi, j+k, bhi)
	}
	return total
}

func ratio(a, b string) float64 {
	ra, rb := []rune(a), []rune(b)
	if len(ra)+len(rb) == 0 {
		return 1
	}
	return 2 * float64(matched(ra, rb, 0, len(ra), 0, len(rb))) / float64(len(ra)+len(rb))
}

// Closest is the choice spelled most like word (case ignored; a ratio of at least 0.6), or
// "": Python's errors.closest.
func Closest(word string, choices []string) string {
	lowered := map[string]string{}
	var order []string
	for _, c := range choices {
		l := strings.ToLower(c)
		if _, ok := lowered[l]; !ok {
			lowered[l] = c
			order = append(order, l)
		}
	}
	bestScore, best := -1.0, ""
	target := strings.ToLower(word)
	for _, candidate := range order {
		score := ratio(candidate, target)
		if score < 0.6 {
			continue
		}
		// (ties: difflib keeps the largest (score, word) pair)
		if score > bestScore || (score == bestScore && candidate > best) {
			bestScore, best = score, candidate
		}
	}
	if best == "" {
		return ""
	}
	return lowered[best]
}

func didYouMean(word string, choices []string) string {
	if c := Closest(word, choices); c != "" {
		return fmt.Sprintf(" (did you mean %s?)", shown(c))
	}
	return ""
}
