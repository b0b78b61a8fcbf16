package deepx

import (
	"math"
	"reflect"
	"strconv"
	"strings"
)

// floatLiteral is a float operand or attribute as a spec holds it: written as Python writes
// a float (2.0, 0.5, 1e-05, 1.5e+16), never as an integer (encoding/json writes float64(2)
// as 2, which the gateway reads as an int literal: x + 2 keeps an int tensor's dtype where
// x + 2.0 does not).
type floatLiteral float64

// MarshalJSON writes f as Python's repr does: shortest digits, fixed between 1e-4 and 1e16.
func (f floatLiteral) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if a := math.Abs(v); a != 0 && (a < 1e-4 || a >= 1e16) {
		text := strconv.FormatFloat(v, 'e', -1, 64) // (1e-05, 1.5e+16: Python's form)
		return []byte(text), nil
	}
	text := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.Contains(text, ".") {
		text += ".0"
	}
	return []byte(text), nil
}

// literal is value with its floats (in lists too) as floatLiterals.
func literal(value any) any {
	switch v := value.(type) {
	case float64:
		return floatLiteral(v)
	case float32:
		return floatLiteral(float64(v))
	case string, bool, nil:
		return v
	}
	list := reflect.ValueOf(value)
	if list.Kind() == reflect.Slice || list.Kind() == reflect.Array {
		out := make([]any, list.Len())
		for i := range out {
			out[i] = literal(list.Index(i).Interface())
		}
		return out
	}
	return value
}
