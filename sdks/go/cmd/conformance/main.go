// The conformance suite's runner for Go (sdks/conformance/run.sh calls it): each case is
// built through the SDK's public API (its steps, by method name) and must give the stored
// graph spec; then it runs on the gateway at DEEPX_URL and must give the stored outputs.
// Each scenario's calls are made in order (make_scenarios.py says what each must give).
// Prints each failure and one line: `go http: N passed, N failed`.
//
//	go run ./cmd/conformance FOLDER...   (of cases and scenarios)
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/deepx-flow/deepx-go/deepx"
)

type tensor struct {
	Dtype    string `json:"dtype"`
	Shape    []int  `json:"shape"`
	Data     []any  `json:"data"`
	Encoding string `json:"encoding"` // "bits": float16 and bfloat16 as their 16-bit patterns
	Pattern  *struct {
		Modulo int     `json:"modulo"`
		Scale  float64 `json:"scale"`
	} `json:"pattern"` // value i is (i mod Modulo) * Scale
}

type refusal struct {
	At       string `json:"at"`
	Kind     string `json:"kind"`
	Message  string `json:"message"`
	Contains string `json:"contains"`
}

type testCase struct {
	Scenario []call            `json:"scenario"`
	Error    *refusal          `json:"error"`
	Name     string            `json:"name"`
	Steps    steps             `json:"steps"`
	Outputs  [][2]string       `json:"outputs"`
	Spec     spec              `json:"spec"`
	Inputs   map[string]tensor `json:"inputs"`
	Expected map[string]tensor `json:"expected"`
	Rtol     float64           `json:"rtol"`
	Atol     float64           `json:"atol"`
}

func ints(v any) []int {
	var out []int
	for _, x := range v.([]any) {
		out = append(out, int(x.(int64)))
	}
	return out
}

// steps are a case's steps with its numbers as written: an integer as int64, a number with
// a point or an exponent as float64 (2.0 stays a float: the SDK writes it so).
type steps []map[string]any

func (s *steps) UnmarshalJSON(text []byte) error {
	var raw []map[string]any
	if err := decodeNumbers(text, &raw); err != nil {
		return err
	}
	for _, step := range raw {
		for k, v := range step {
			step[k] = asWritten(v)
		}
	}
	*s = raw
	return nil
}

// spec is a stored graph spec with its numbers as written (json.Number), for comparing.
type spec map[string]any

func (s *spec) UnmarshalJSON(text []byte) error {
	return decodeNumbers(text, (*map[string]any)(s))
}

func decodeNumbers(text []byte, into any) error {
	decoder := json.NewDecoder(bytes.NewReader(text))
	decoder.UseNumber()
	return decoder.Decode(into)
}

func asWritten(v any) any {
	switch x := v.(type) {
	case json.Number:
		if !strings.ContainsAny(string(x), ".eE") {
			n, _ := x.Int64()
			return n
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = asWritten(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = asWritten(x[k])
		}
	}
	return v
}

// built makes the case's graph by calling the method named by each step.
func built(c testCase) (*deepx.Graph, error) {
	g := deepx.NewGraph()
	tensors := map[string]*deepx.Tensor{}
	for _, step := range c.Steps {
		if name, ok := step["input"].(string); ok {
			tensors[name] = g.Input(name, ints(step["shape"]), step["dtype"].(string))
			continue
		}
		op := step["op"].(string)
		var operands []deepx.Operand
		for _, a := range step["args"].([]any) {
			if id, ok := a.(string); ok {
				operands = append(operands, tensors[id])
			} else {
				operands = append(operands, a)
			}
		}
		options := deepx.Options{"id": step["id"]}
		for k, v := range step["attrs"].(map[string]any) {
			options[k] = v
		}
		if s, ok := step["shape"]; ok {
			options["shape"] = ints(s)
		}
		if d, ok := step["dtype"]; ok {
			options["dtype"] = d
		}
		method := reflect.ValueOf(g).MethodByName(deepx.MethodName(op))
		// (the generic Op for a name the table lacks, or more operands than its method
		// takes: a mistake Go's types keep out of the method itself)
		if !method.IsValid() || method.Type().In(0) != reflect.TypeOf([]deepx.Operand{}) &&
			len(operands) > method.Type().NumIn()-1 {
			tensors[step["id"].(string)] = g.Op(op, operands, options)
			continue
		}
		kind := method.Type()
		var args []reflect.Value
		if kind.NumIn() > 1 && kind.In(0) == reflect.TypeOf([]deepx.Operand{}) {
			args = append(args, reflect.ValueOf(operands)) // (a list of operands: concat)
		} else {
			for i := 0; i < kind.NumIn()-1; i++ { // (nil for an optional input left out)
				var v deepx.Operand
				if i < len(operands) {
					v = operands[i]
				}
				args = append(args, reflect.ValueOf(&v).Elem())
			}
		}
		args = append(args, reflect.ValueOf(options))
		tensors[step["id"].(string)] = method.Call(args)[0].Interface().(*deepx.Tensor)
	}
	for _, o := range c.Outputs {
		g.Output(tensors[o[1]], o[0])
	}
	return g, g.Err()
}

func number(v any) float64 {
	switch x := v.(type) {
	case string:
		switch x {
		case "NaN":
			return math.NaN()
		case "Infinity":
			return math.Inf(1)
		case "-Infinity":
			return math.Inf(-1)
		}
		f, _ := strconv.ParseFloat(x, 64)
		return f
	case bool:
		if x {
			return 1
		}
		return 0
	}
	return v.(float64)
}

// each converts a case's values to a Go slice of T.
func each[T any](data []any, convert func(any) T) []T {
	out := make([]T, len(data))
	for i, x := range data {
		out[i] = convert(x)
	}
	return out
}

func decimal[T int64 | uint64](parse func(string) (T, error)) func(any) T {
	return func(x any) T {
		v, _ := parse(x.(string))
		return v
	}
}

func values(t tensor) deepx.Values {
	v := deepx.Values{Shape: t.Shape, Dtype: t.Dtype}
	if t.Shape == nil {
		v.Shape = []int{}
	}
	if t.Pattern != nil {
		t.Data = make([]any, 1)
		for _, d := range t.Shape {
			t.Data = make([]any, len(t.Data)*d)
		}
		for i := range t.Data {
			t.Data[i] = float64(i%t.Pattern.Modulo) * t.Pattern.Scale
		}
	}
	switch t.Dtype {
	case "float16", "bfloat16", "uint16": // (16-bit floats as their patterns)
		v.Data = each(t.Data, func(x any) uint16 { return uint16(number(x)) })
	case "int8":
		v.Data = each(t.Data, func(x any) int8 { return int8(number(x)) })
	case "int16":
		v.Data = each(t.Data, func(x any) int16 { return int16(number(x)) })
	case "int32":
		v.Data = each(t.Data, func(x any) int32 { return int32(number(x)) })
	case "uint8":
		v.Data = each(t.Data, func(x any) uint8 { return uint8(number(x)) })
	case "uint32":
		v.Data = each(t.Data, func(x any) uint32 { return uint32(number(x)) })
	case "int64": // (decimal strings: exact past 2**53)
		v.Data = each(t.Data, decimal(func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }))
	case "uint64":
		v.Data = each(t.Data, decimal(func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }))
	case "float32":
		v.Data = each(t.Data, func(x any) float32 { return float32(number(x)) })
	case "float64":
		v.Data = each(t.Data, number)
	case "bool":
		v.Data = each(t.Data, func(x any) bool { return x.(bool) })
	default:
		panic("no conversion for " + t.Dtype)
	}
	return v
}

func flat(v deepx.Values) []float64 {
	r := reflect.ValueOf(v.Data)
	out := make([]float64, r.Len())
	for i := range out {
		switch x := r.Index(i).Interface().(type) {
		case bool:
			if x {
				out[i] = 1
			}
		default:
			out[i] = reflect.ValueOf(x).Convert(reflect.TypeOf(float64(0))).Float()
		}
	}
	return out
}

func compare(got, want deepx.Values, rtol, atol float64, name string) error {
	if got.Dtype != want.Dtype || !reflect.DeepEqual(got.Shape, want.Shape) {
		return fmt.Errorf("%s: %s%v, not %s%v", name, got.Dtype, got.Shape, want.Dtype, want.Shape)
	}
	exact := rtol == 0 && atol == 0
	if want.Dtype == "int64" || want.Dtype == "uint64" || exact && want.Dtype != "float32" && want.Dtype != "float64" {
		if reflect.ValueOf(got.Data).Len() != reflect.ValueOf(want.Data).Len() || (reflect.ValueOf(want.Data).Len() > 0 && !reflect.DeepEqual(got.Data, want.Data)) {
			return fmt.Errorf("%s: %v, not %v", name, got.Data, want.Data)
		}
		return nil
	}
	a, b := flat(got), flat(want)
	if len(a) != len(b) {
		return fmt.Errorf("%s: %d values, not %d", name, len(a), len(b))
	}
	for i := range b {
		if exact { // (-0 is not 0, and NaN is NaN)
			if math.Float64bits(a[i]) != math.Float64bits(b[i]) && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
				return fmt.Errorf("%s[%d]: %v, not %v", name, i, a[i], b[i])
			}
			continue
		}
		if math.IsNaN(a[i]) && math.IsNaN(b[i]) || a[i] == b[i] || math.Abs(a[i]-b[i]) <= atol+rtol*math.Abs(b[i]) {
			continue
		}
		return fmt.Errorf("%s[%d]: %v, not %v", name, i, a[i], b[i])
	}
	return nil
}

func refused(err error, want *refusal) error {
	e, ok := err.(*deepx.Error)
	switch {
	case !ok:
		return fmt.Errorf("not refused as %s: %v", want.Kind, err)
	case e.Kind != want.Kind:
		return fmt.Errorf("the kind: %s, not %s (%v)", e.Kind, want.Kind, err)
	case want.Message != "" && e.Error() != want.Message:
		return fmt.Errorf("the message: %q, not %q", e.Error(), want.Message)
	case want.Contains != "" && !strings.Contains(e.Error(), want.Contains):
		return fmt.Errorf("the message: %q has no %q", e.Error(), want.Contains)
	}
	return nil
}

// sameSpec is nil where g's spec is the stored one (compared as JSON writes them: the SDK
// keeps numbers as written, json.Number).
func sameSpec(g *deepx.Graph, stored map[string]any) error {
	spec, err := g.Spec()
	if err != nil {
		return err
	}
	built, _ := json.Marshal(spec)
	want, _ := json.Marshal(stored)
	if string(built) != string(want) {
		return fmt.Errorf("the graph the steps build: %s", built)
	}
	return nil
}

func run(c testCase, client *deepx.Client) error {
	g, err := built(c)
	if c.Error != nil && c.Error.At == "build" {
		return refused(err, c.Error)
	}
	if err != nil {
		return err
	}
	if err := sameSpec(g, c.Spec); err != nil {
		return err
	}
	done, err := client.Execute(g, inputsOf(c.Inputs))
	if c.Error != nil {
		return refused(err, c.Error)
	}
	if err != nil {
		return err
	}
	if done.State != "succeeded" {
		return fmt.Errorf("%s: %s", done.State, done.Error)
	}
	for name, want := range c.Expected {
		if err := compare(done.Outputs[name], values(want), c.Rtol, c.Atol, name); err != nil {
			return err
		}
	}
	return nil
}

// prefix names this runner's assets, on a gateway others use too
const prefix = "go_http_"

func main() {
	var files []string
	for _, folder := range os.Args[1:] {
		found, _ := filepath.Glob(filepath.Join(folder, "*.json"))
		sort.Strings(found)
		files = append(files, found...)
	}
	client := deepx.NewClient(os.Getenv("DEEPX_URL"))
	passed, failed := 0, 0
	for _, file := range files {
		var c testCase
		text, err := os.ReadFile(file)
		if err == nil {
			err = json.Unmarshal([]byte(strings.ReplaceAll(string(text), "{prefix}", prefix)), &c)
		}
		if err == nil && c.Scenario != nil {
			err = runScenario(c, client)
		} else if err == nil {
			err = run(c, client)
		}
		if err != nil {
			failed++
			fmt.Printf("FAILED %s: %v\n", filepath.Base(file), err)
			continue
		}
		passed++
	}
	fmt.Printf("go http: %d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
