package deepx

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestOperatorsBuildTheCanonicalSpec(t *testing.T) {
	g := NewGraph()
	x := g.Input("x", []int{2, 3}, "float32")
	y := g.Relu(g.Add(x, 1.5))
	s := g.Sum(y, Options{"axes": []int{1}, "keepdims": true, "id": "total"})
	m := g.Argmax(x, Options{"axis": -1})
	g.Output(s, "").Output(m, "label")
	got, err := g.Spec()
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	decoder := json.NewDecoder(strings.NewReader(`{"deepx": 1, "inputs": {"x": {"shape": [2, 3], "dtype": "float32"}},
	  "nodes": [{"id": "add_0", "op": "add", "args": ["x", 1.5]},
	            {"id": "relu_1", "op": "relu", "args": ["add_0"]},
	            {"id": "total", "op": "sum", "args": ["relu_1"], "attrs": {"axes": [1], "keepdims": true}},
	            {"id": "argmax_3", "op": "argmax", "args": ["x"], "attrs": {"axis": -1}}],
	  "outputs": ["total", {"label": "argmax_3"}]}`))
	decoder.UseNumber() // (as Spec gives numbers: as written)
	decoder.Decode(&want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

func TestSourcesStateAndOptionalInputsMayBeNil(t *testing.T) {
	g := NewGraph()
	f := g.Full(Options{"shape": []int{2}, "dtype": "float64", "value": 2})
	x := g.Input("x", []int{4, 5}, "float32")
	n := g.LayerNorm(x, nil, nil, Options{"eps": 0.001})
	g.Output(f, "").Output(n, "")
	got, err := g.Spec()
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := json.Marshal(got["nodes"])
	want := `[{"args":[],"attrs":{"value":2},"dtype":"float64","id":"full_0","op":"full","shape":[2]},` +
		`{"args":["x"],"attrs":{"eps":0.001},"id":"layer_norm_1","op":"layer_norm"}]`
	if string(nodes) != want {
		t.Fatalf("got %s", nodes)
	}
}

func TestMistakesAreKeptWithPythonsMessages(t *testing.T) {
	cases := []struct {
		build func(g *Graph, x *Tensor)
		says  string
	}{
		{func(g *Graph, x *Tensor) { g.Op("relux", []Operand{x}) },
			"node 'relux_0': unknown operator 'relux' (did you mean 'relu'?) (see docs/graph-spec.md or `deepx-flow ops` for the list)"},
		{func(g *Graph, x *Tensor) { g.Op("add", []Operand{x}) }, "node 'add_0': add takes 2 input(s), got 1"},
		{func(g *Graph, x *Tensor) { g.Sum(x, Options{"axis": 1}) },
			"node 'sum_0': sum has no attribute 'axis' (allowed: axes, keepdims); did you mean 'axes'?"},
		{func(g *Graph, x *Tensor) { g.OneHot(x, Options{}) }, "node 'one_hot_0': one_hot needs attribute 'classes'"},
		{func(g *Graph, x *Tensor) { g.Op("leaky_relu", []Operand{x, x}) },
			"node 'leaky_relu_0': leaky_relu takes 1 input(s) (x), got 2"},
		{func(g *Graph, x *Tensor) { g.Full(Options{"shape": []int{1}, "dtype": "float32"}) },
			"node 'full_0': full needs attribute 'value'"},
		{func(g *Graph, x *Tensor) { g.Full(Options{"dtype": "float32", "value": 1}) },
			"node 'full_0': full needs a declared shape"},
		{func(g *Graph, x *Tensor) { g.LeakyRelu(x, Options{"alpha": math.Inf(1)}) },
			"node 'leaky_relu_0': attribute 'alpha' is +Inf, not a value a spec holds (a finite number, a string, a bool, nil, or a list of them)"},
		{func(g *Graph, x *Tensor) { g.LayerNorm(x, nil, x) },
			"node 'layer_norm_0': layer_norm: input 3 is given after one left out (nil); only the last inputs may be left out"},
		{func(g *Graph, x *Tensor) { g.Relu(NewGraph().Input("y", []int{1}, "float32")) },
			"an operand of 'relu_0' is not a tensor of this graph"},
		{func(g *Graph, x *Tensor) { g.Input("x", []int{1}, "float32") }, "node 'x': this id is taken by another input or node"},
		{func(g *Graph, x *Tensor) { g.Input("z", []int{1}, "float8") }, "node 'z': unknown dtype 'float8' (did you mean 'float64'?)"},
	}
	for _, c := range cases {
		g := NewGraph()
		x := g.Input("x", []int{2, 3}, "float32")
		c.build(g, x)
		g.Relu(x) // (after a mistake, calls do nothing)
		g.Output(x, "")
		_, err := g.Spec()
		e, ok := err.(*Error)
		if !ok || e.Error() != c.says || e.Kind != "GraphError" {
			t.Errorf("got %v, want %q", err, c.says)
		}
	}
	if _, err := NewGraph().Spec(); err == nil || err.Error() != "the graph has no outputs: name at least one (graph.Output)" {
		t.Errorf("got %v", err)
	}
}

func TestClosestSpellsAsDifflib(t *testing.T) {
	for _, c := range [][3]string{{"relux", "relu", ""}, {"Sum", "sum", ""}, {"zzz", "", ""}} {
		if got := Closest(c[0], []string{"relu", "gelu", "exp", "sum", "mean"}); got != c[1] {
			t.Errorf("Closest(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}

func TestEveryOperatorButInputIsAMethod(t *testing.T) {
	g := reflect.ValueOf(NewGraph())
	for name := range operators {
		if name != "input" && !g.MethodByName(MethodName(name)).IsValid() {
			t.Errorf("no method %s for %s", MethodName(name), name)
		}
	}
}

func TestValuesCrossAsBytesExactly(t *testing.T) {
	v := Values{Shape: []int{2}, Dtype: "int64", Data: []int64{1 << 62, -3}}
	b, err := v.raw()
	if err != nil {
		t.Fatal(err)
	}
	back, err := fromRaw("int64", []int{2}, b)
	if err != nil || !reflect.DeepEqual(back.Data, v.Data) {
		t.Fatalf("got %v, %v", back, err)
	}
	if _, err := (Values{Shape: []int{3}, Dtype: "float32", Data: []float32{1, 2}}).raw(); err == nil ||
		err.Error() != "2 values, but shape [3] holds 3" {
		t.Errorf("got %v", err)
	}
	if _, err := (Values{Shape: []int{1}, Dtype: "int32", Data: []float32{1}}).raw(); err == nil {
		t.Error("a dtype's data of another type was taken")
	}
	f, _ := ToFloat32(Values{Dtype: "float16", Data: []uint16{0x3c00, 0xc000}})
	b16, _ := ToFloat32(Values{Dtype: "bfloat16", Data: []uint16{0x3f80, 0x4049}})
	if !reflect.DeepEqual(f, []float32{1, -2}) || !reflect.DeepEqual(b16, []float32{1, 3.140625}) {
		t.Errorf("got %v %v", f, b16)
	}
}

func TestLargeIntegersAreWrittenAsGiven(t *testing.T) {
	g := NewGraph()
	x := g.Input("x", []int{2}, "int64")
	g.Output(g.Add(x, int64(1)<<62+1, Options{"id": "y"}), "")
	g.Output(g.RandomNormal(Options{"shape": []int{1}, "dtype": "float32", "seed": int64(1)<<60 + 1}), "r")
	spec, err := g.Spec()
	if err != nil {
		t.Fatal(err)
	}
	text, _ := json.Marshal(spec["nodes"])
	want := `[{"args":["x",4611686018427387905],"id":"y","op":"add"},` +
		`{"args":[],"attrs":{"seed":1152921504606846977},"dtype":"float32","id":"random_normal_1","op":"random_normal","shape":[1]}]`
	if string(text) != want {
		t.Fatalf("got %s", text)
	}
}

func TestANodeMayStateItsShapeAndIDsMadeDoNotTakeANameGiven(t *testing.T) {
	g := NewGraph()
	x := g.Input("x", []int{2, 3}, "float32")
	g.Relu(x, Options{"id": "relu_1"})
	y := g.Relu(x, Options{"shape": []int{2, 3}})
	if y.ID != "relu_2" || g.Err() != nil {
		t.Fatalf("got %s, %v", y.ID, g.Err())
	}
}

func TestAFloatIsWrittenAsPythonWritesIt(t *testing.T) {
	for value, want := range map[float64]string{2: "2.0", 0.5: "0.5", 1e-5: "1e-05",
		123456789: "123456789.0", 1.5e16: "1.5e+16", -1: "-1.0", math.Copysign(0, -1): "-0.0"} {
		got, _ := json.Marshal(literal(value))
		if string(got) != want {
			t.Errorf("%v: %s, not %s", value, got, want)
		}
	}
	g := NewGraph()
	x := g.Input("x", []int{2}, "int32")
	g.Output(g.Add(g.Add(x, 2), 2.0, Options{"id": "y"}), "y")
	spec, err := g.Spec()
	if err != nil {
		t.Fatal(err)
	}
	text, _ := json.Marshal(spec["nodes"])
	if !strings.Contains(string(text), `["x",2]`) || !strings.Contains(string(text), `["add_0",2.0]`) {
		t.Fatalf("an int literal stays an int, a float a float: %s", text)
	}
}
