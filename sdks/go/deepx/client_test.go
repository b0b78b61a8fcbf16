package deepx

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Against a running gateway (DEEPX_URL, as the Python tests start one; skipped without).
func gateway(t *testing.T) *Client {
	url := os.Getenv("DEEPX_URL")
	if url == "" {
		t.Skip("DEEPX_URL names no gateway")
	}
	return NewClient(url)
}

func TestAGraphRunsOnTheGatewayAndInt64CrossesExactly(t *testing.T) {
	client := gateway(t)
	g := NewGraph()
	x := g.Input("x", []int{2, 3}, "float32")
	n := g.Input("n", []int{2}, "int64")
	g.Output(g.Sum(g.LeakyRelu(g.Mul(x, 2), Options{"alpha": 0.5}), Options{"axes": []int{1}}), "total")
	g.Output(g.Add(n, 1), "next")
	done, err := client.Execute(g, map[string]Values{
		"x": {Shape: []int{2, 3}, Dtype: "float32", Data: []float32{1, -2, 3, -4, 5, -6}},
		"n": {Shape: []int{2}, Dtype: "int64", Data: []int64{1<<62 + 3, -(1<<62 + 3)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if done.State != "succeeded" || !reflect.DeepEqual(done.Outputs["total"].Data, []float32{6, 0}) ||
		!reflect.DeepEqual(done.Outputs["next"].Data, []int64{1<<62 + 4, -(1<<62 + 2)}) {
		t.Fatalf("got %+v", done)
	}
	again, err := client.GetOperation(done.Operation, 30*time.Second)
	if err != nil || again.State != "succeeded" || !reflect.DeepEqual(again.Outputs["total"].Data, []float32{6, 0}) {
		t.Fatalf("got %+v, %v", again, err)
	}
	runs, err := client.Runs("", 1)
	if err != nil || len(runs) != 1 {
		t.Fatalf("got %v, %v", runs, err)
	}
}

func TestTheGatewaysRefusalsAreErrorsWithTheirKind(t *testing.T) {
	client := gateway(t)
	spec := map[string]any{"deepx": 1, "inputs": map[string]any{"x": map[string]any{"shape": []int{2}, "dtype": "float32"}},
		"nodes": []any{map[string]any{"id": "y", "op": "add", "args": []any{"x", "missing"}}}, "outputs": []any{"y"}}
	_, err := client.Execute(spec, map[string]Values{"x": {Shape: []int{2}, Dtype: "float32", Data: []float32{1, 2}}})
	if e, ok := err.(*Error); !ok || e.Kind != "SpecError" || e.Status != 400 {
		t.Fatalf("got %v", err)
	}
	if _, err := client.GetOperation("no-such-operation", 0); err == nil || err.(*Error).Kind != "NotFound" {
		t.Fatalf("got %v", err)
	}
	if _, err := NewClient("http://127.0.0.1:9").Runs("", 1); err == nil || err.(*Error).Kind != "RemoteError" {
		t.Fatalf("got %v", err)
	}
}

func TestAssetsAreDefinedMaterializedAndRead(t *testing.T) {
	client := gateway(t)
	name := fmt.Sprintf("go_readings_%d", time.Now().UnixNano())
	g := NewGraph()
	n := g.Arange(Options{"shape": []int{8}, "dtype": "float64", "start": 0, "step": 0.5})
	g.Output(g.Reshape(n, Options{"shape": []int{4, 2}}), "r")
	if _, err := client.DefineAsset(name, g, map[string]any{"checks": []any{map[string]any{"kind": "all_finite"}}}); err != nil {
		t.Fatal(err)
	}
	made, err := client.Materialize(name, map[string]any{"wait_seconds": 120})
	if err != nil || made.State != "succeeded" {
		t.Fatalf("got %+v, %v", made, err)
	}
	read, err := client.ReadAsset(name, map[string]any{"slice": [][]int{{1, 3}}})
	if err != nil || !reflect.DeepEqual(read.Shape, []int{2, 2}) || !reflect.DeepEqual(read.Data, []float64{1, 1.5, 2, 2.5}) {
		t.Fatalf("got %+v, %v", read, err)
	}
	if _, err := client.ReadAsset("no_such_asset", nil); err == nil || err.(*Error).Kind != "NotFound" {
		t.Fatalf("got %v", err)
	}
}

// counting is a transport that counts the requests for operations it carries.
type counting struct {
	asked int
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasPrefix(r.URL.Path, "/v1/operations/") {
		c.asked++
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestARunLongerThanOneWaitIsAskedForAgainUntilItEnds(t *testing.T) {
	client := gateway(t)
	transport := &counting{}
	client.HTTP = &http.Client{Transport: transport, Timeout: time.Minute}
	client.Poll = time.Millisecond // (submitting the 20 matmuls of 512 x 512 alone takes longer)
	g := NewGraph()
	a := g.Full(Options{"shape": []int{512, 512}, "dtype": "float32", "value": 1.0 / 512})
	m := a
	for i := 0; i < 20; i++ {
		m = g.Matmul(m, a)
	}
	g.Output(g.Sum(m), "total")
	done, err := client.Execute(g, nil, ExecuteOptions{OperationID: fmt.Sprintf("go-slow-%d", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	total := done.Outputs["total"].Data.([]float32)[0]
	if done.State != "succeeded" || math.Abs(float64(total)-512) > 1e-2 || transport.asked < 1 {
		t.Fatalf("%s %v, asked again %d times", done.State, total, transport.asked)
	}
	runs, err := client.Runs("succeeded", 5)
	if err != nil || len(runs) == 0 || runs[0]["status"] != "succeeded" {
		t.Fatalf("runs of status succeeded: %v %v", runs, err)
	}
}
