package deepx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
)

// Dtypes every graph may use.
var Dtypes = []string{"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
	"uint64", "float16", "bfloat16", "float32", "float64"}

// Options of an operator call: its attributes by name, and "id" (the node's id), "shape"
// and "dtype" (what a node that states them states).
type Options map[string]any

// Operand is a *Tensor of the same graph, or a number or bool (a literal in the spec).
type Operand any

// Tensor is one node of a graph.
type Tensor struct {
	graph *Graph
	ID    string
	Op    string
}

type node struct {
	ID    string         `json:"id"`
	Op    string         `json:"op"`
	Args  []any          `json:"args"`
	Shape []int          `json:"shape,omitempty"`
	Dtype string         `json:"dtype,omitempty"`
	Attrs map[string]any `json:"attrs,omitempty"`
}

type input struct {
	Shape []int  `json:"shape"`
	Dtype string `json:"dtype"`
}

// Graph holds the nodes of a graph in the order they were made. A mistake in a call (an
// unknown operator, the wrong number of inputs, an unknown or missing attribute) is kept,
// with Python's message, and every later call does nothing: Err and Spec give it, as a
// bufio.Scanner does. Node ids are the ids given (Options{"id": ...}) or <op>_<n> in the
// order nodes were made; attributes are those given.
type Graph struct {
	inputs     map[string]input
	inputOrder []string
	nodes      []node
	outputs    [][2]string
	ids        map[string]bool
	err        error
}

// NewGraph is an empty graph.
func NewGraph() *Graph {
	return &Graph{inputs: map[string]input{}, ids: map[string]bool{}}
}

// Err is the first mistake made while building, or nil.
func (g *Graph) Err() error { return g.err }

func (g *Graph) fail(err *Error) *Tensor {
	if g.err == nil {
		g.err = err
	}
	return &Tensor{graph: g, ID: "", Op: "error"}
}

// Input is a named input of shape and dtype.
func (g *Graph) Input(name string, shape []int, dtype string) *Tensor {
	if g.err != nil {
		return &Tensor{graph: g}
	}
	if err := checkShape(shape, name); err != nil {
		return g.fail(err)
	}
	if !contains(Dtypes, dtype) {
		return g.fail(&Error{Kind: "GraphError", Node: name,
			Message: fmt.Sprintf("unknown dtype %s%s", shown(dtype), didYouMean(dtype, Dtypes))})
	}
	if g.ids[name] {
		return g.fail(graphError(name, "this id is taken by another input or node"))
	}
	g.ids[name] = true
	g.inputs[name] = input{append([]int{}, shape...), dtype}
	g.inputOrder = append(g.inputOrder, name)
	return &Tensor{graph: g, ID: name, Op: "input"}
}

// Op applies any operator by name; every operator of the table also has a method of its
// own (operators.go, generated).
func (g *Graph) Op(name string, inputs []Operand, options ...Options) *Tensor {
	if g.err != nil {
		return &Tensor{graph: g}
	}
	given := Options{}
	for _, o := range options {
		for k, v := range o {
			given[k] = v
		}
	}
	id := g.autoID(name)
	if v, ok := given["id"]; ok {
		s, isString := v.(string)
		if !isString || s == "" {
			return g.fail(graphError(id, "an id is a non-empty string, not %s", shown(v)))
		}
		id = s
	}
	delete(given, "id")
	entry, ok := operators[name]
	if !ok || name == "input" {
		var names []string
		for n := range operators {
			if n != "input" {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		return g.fail(graphError(id, "unknown operator %s%s (see docs/graph-spec.md or "+
			"`deepx-flow ops` for the list)", shown(name), didYouMean(name, names)))
	}
	if err := checkInputs(entry, inputs, id); err != nil {
		return g.fail(err)
	}
	n := node{ID: id, Op: name, Args: []any{}}
	// (a node may state its shape or dtype: the gateway checks it against its rule)
	for _, field := range []string{"shape", "dtype"} {
		value, isGiven := given[field]
		delete(given, field)
		if !isGiven || value == nil {
			if st, ok := entry.states[field]; ok && st.required {
				return g.fail(graphError(id, "%s needs a declared %s", name, field))
			}
			continue
		}
		if field == "shape" {
			shape, ok := value.([]int)
			if !ok {
				return g.fail(graphError(id, "shape must be a []int, not %T", value))
			}
			if err := checkShape(shape, id); err != nil {
				return g.fail(err)
			}
			n.Shape = append([]int{}, shape...)
		} else {
			dtype, ok := value.(string)
			if !ok || !contains(Dtypes, dtype) {
				return g.fail(graphError(id, "unknown dtype %s", shown(value)))
			}
			n.Dtype = dtype
		}
	}
	if err := checkAttrs(entry, given, id); err != nil {
		return g.fail(err)
	}
	for _, operand := range inputs {
		if operand == nil {
			continue // (an optional input left out: only at the end, checkInputs says)
		}
		arg, err := g.arg(operand, id)
		if err != nil {
			return g.fail(err)
		}
		n.Args = append(n.Args, arg)
	}
	if len(given) > 0 {
		n.Attrs = map[string]any{}
		for k, v := range given {
			n.Attrs[k] = literal(v)
		}
	}
	if g.ids[id] {
		return g.fail(graphError(id, "this id is taken by another input or node"))
	}
	g.ids[id] = true
	g.nodes = append(g.nodes, n)
	return &Tensor{graph: g, ID: id, Op: name}
}

// Output names t as an output of the graph (its id, where name is "").
func (g *Graph) Output(t *Tensor, name string) *Graph {
	if g.err != nil {
		return g
	}
	if t == nil || t.graph != g || t.ID == "" {
		g.fail(&Error{Kind: "GraphError", Message: "an output is not a tensor of this graph"})
		return g
	}
	if name == "" {
		name = t.ID
	}
	for _, o := range g.outputs {
		if o[0] == name {
			g.fail(&Error{Kind: "GraphError", Message: fmt.Sprintf("output %s is named twice", shown(name))})
			return g
		}
	}
	g.outputs = append(g.outputs, [2]string{name, t.ID})
	return g
}

// Spec is the graph spec the gateway reads, or the first mistake made building it.
func (g *Graph) Spec() (map[string]any, error) {
	if g.err != nil {
		return nil, g.err
	}
	if len(g.outputs) == 0 {
		return nil, &Error{Kind: "GraphError", Message: "the graph has no outputs: name at least one (graph.Output)"}
	}
	outputs := []any{}
	for _, o := range g.outputs {
		if o[0] == o[1] {
			outputs = append(outputs, o[1])
		} else {
			outputs = append(outputs, map[string]any{o[0]: o[1]})
		}
	}
	spec := map[string]any{"deepx": 1, "inputs": g.inputs, "nodes": g.nodes, "outputs": outputs}
	// (as JSON reads it back, numbers kept as written: an int64 past 2**53 is not rounded)
	text, err := json.Marshal(spec)
	if err != nil {
		return nil, &Error{Kind: "GraphError", Message: err.Error()}
	}
	decoder := json.NewDecoder(bytes.NewReader(text))
	decoder.UseNumber()
	var out map[string]any
	if err := decoder.Decode(&out); err != nil {
		return nil, &Error{Kind: "GraphError", Message: err.Error()}
	}
	return out, nil
}

func (g *Graph) arg(operand Operand, id string) (any, *Error) {
	switch v := operand.(type) {
	case *Tensor:
		if v == nil || v.graph != g || v.ID == "" {
			return nil, &Error{Kind: "GraphError", Message: fmt.Sprintf("an operand of %s is not a tensor of this graph", shown(id))}
		}
		return v.ID, nil
	case bool:
		return v, nil
	case int:
		return v, nil
	case int64:
		return v, nil
	case float32:
		return finite(float64(v), id)
	case float64:
		return finite(v, id)
	}
	return nil, graphError(id, "an operand is %T, not a tensor of this graph or a number", operand)
}

func finite(v float64, id string) (any, *Error) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, graphError(id, "an operand is %v, not a finite number", v)
	}
	return floatLiteral(v), nil
}

func checkShape(shape []int, id string) *Error {
	for _, d := range shape {
		if d < 0 {
			return graphError(id, "shape must be a list of non-negative integers, got %v", shape)
		}
	}
	return nil
}

func checkInputs(entry opEntry, inputs []Operand, id string) *Error {
	required, variadic := 0, false
	for _, in := range entry.inputs {
		if strings.HasSuffix(in, "...") {
			variadic = true
		}
		if !strings.HasSuffix(in, "?") {
			required++
		}
	}
	given := 0
	for i, in := range inputs {
		if in != nil {
			if given < i { // (a nil before it: the operands would shift into its place)
				return graphError(id, "%s: input %d is given after one left out (nil); only the "+
					"last inputs may be left out", entry.name, i+1)
			}
			given++
		}
	}
	switch {
	case variadic:
		if given < 1 {
			return graphError(id, "%s needs at least one input", entry.name)
		}
	case entry.kind == "composite" && required != len(entry.inputs):
		if given < required || given > len(entry.inputs) {
			return graphError(id, "%s takes %d to %d input(s) (%s), got %d", entry.name, required,
				len(entry.inputs), strings.Join(entry.inputs, ", "), given)
		}
	case given != len(entry.inputs):
		listed := ""
		if entry.kind == "composite" {
			listed = " (" + strings.Join(entry.inputs, ", ") + ")"
		}
		return graphError(id, "%s takes %d input(s)%s, got %d", entry.name, len(entry.inputs), listed, given)
	}
	return nil
}

func checkAttrs(entry opEntry, given Options, id string) *Error {
	known := entry.attrOrder
	keys := make([]string, 0, len(given))
	for key := range given {
		keys = append(keys, key)
	}
	sort.Strings(keys) // (the first unknown one named, whatever the map's order)
	for _, key := range keys {
		value := given[key]
		if _, ok := entry.attrs[key]; !ok {
			hint := ""
			if c := Closest(key, known); c != "" {
				hint = fmt.Sprintf("; did you mean %s?", shown(c))
			}
			allowed := strings.Join(known, ", ")
			if allowed == "" {
				allowed = "none"
			}
			return graphError(id, "%s has no attribute %s (allowed: %s)%s", entry.name, shown(key), allowed, hint)
		}
		if value == nil {
			delete(given, key)
			continue
		}
		if problem := checkValue(value, 0); problem != "" {
			return graphError(id, "attribute %s is %s, not a value a spec holds (a finite number, "+
				"a string, a bool, nil, or a list of them)", shown(key), problem)
		}
	}
	for _, key := range entry.attrOrder {
		if entry.attrs[key].required {
			if _, ok := given[key]; !ok {
				return graphError(id, "%s needs attribute %s", entry.name, shown(key))
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// MethodName is the Graph method of operator name: leaky_relu is LeakyRelu.
func MethodName(name string) string {
	parts := strings.Split(name, "_")
	for i, p := range parts {
		if p != "" {
			parts[i] = strings.ToUpper(p[:1]) + p[1:]
		}
	}
	return strings.Join(parts, "")
}

// autoID is <op>_<n>, n the node's place; past an id taken by a name given, the next free n.
func (g *Graph) autoID(name string) string {
	for n := len(g.nodes); ; n++ {
		if id := fmt.Sprintf("%s_%d", name, n); !g.ids[id] {
			return id
		}
	}
}

// checkValue is what is wrong with an attribute's value, or "": a spec holds finite
// numbers, strings, bools and lists of them (NaN and the infinities do not cross as JSON).
func checkValue(value any, depth int) string {
	switch v := value.(type) {
	case bool, string, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, json.Number:
		return ""
	case float32:
		return checkValue(float64(v), depth)
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprint(v)
		}
		return ""
	}
	list := reflect.ValueOf(value)
	if (list.Kind() == reflect.Slice || list.Kind() == reflect.Array) && depth < 32 {
		for i := 0; i < list.Len(); i++ {
			if problem := checkValue(list.Index(i).Interface(), depth+1); problem != "" {
				return problem
			}
		}
		return ""
	}
	return fmt.Sprintf("%T", value)
}
