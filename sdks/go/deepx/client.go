package deepx

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

const headerLength = "Inference-Header-Content-Length"

var kindOfStatus = map[int]string{400: "InputError", 401: "Unauthenticated", 404: "NotFound",
	405: "NotFound", 413: "TooLarge", 500: "ExecutionError"}

// Client calls a deepx_flow gateway (deepx-flow serve's HTTP port) over its contract
// (docs/contract.md). Tensors travel as the protocol's binary data both ways.
type Client struct {
	URL   string
	Token string // a bearer token, for a gateway that needs one
	HTTP  *http.Client
	// Poll is how long one exchange waits for a run (a minute): a longer one is asked for
	// again by its operation id until it ends, never left to the HTTP client's timeout.
	Poll time.Duration
}

// NewClient is a client of the gateway at baseURL, with DEEPX_GATEWAY_TOKEN as its token
// where that is set.
func NewClient(baseURL string) *Client {
	return &Client{URL: strings.TrimRight(baseURL, "/"), Token: os.Getenv("DEEPX_GATEWAY_TOKEN"),
		HTTP: &http.Client{Timeout: 10 * time.Minute}, Poll: time.Minute}
}

// ExecuteOptions are Execute's and Start's options: Outputs, the names of the outputs to
// compute (all where nil); OperationID, the caller's id for the operation (sent again, it
// attaches to the first instead of running twice; one is made where "").
type ExecuteOptions struct {
	Outputs     []string
	OperationID string
}

// newOperationID is 32 random hex digits.
func newOperationID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // (the system's randomness failed: nothing sensible to do)
	}
	return hex.EncodeToString(b)
}

// Operation is an operation's answer: State, Operation (its id), RunID, Dashboard (the
// run's page), Progress (while it runs, and once it succeeded), its Outputs once it
// succeeded, and every other field the gateway said (Fields).
type Operation struct {
	State     string
	Operation string
	RunID     string
	Dashboard string
	Progress  *Progress
	Error     string
	Outputs   map[string]Values
	Fields    map[string]any
}

// Progress is how far an operation's run has got: TasksDone of TasksTotal.
type Progress struct {
	TasksDone, TasksTotal int
}

func specOf(graph any) (any, error) {
	if g, ok := graph.(*Graph); ok {
		return g.Spec()
	}
	return graph, nil
}

// Capabilities is what the gateway speaks: protocol version, operator table and its hash,
// limits.
func (c *Client) Capabilities() (map[string]any, error) {
	var out map[string]any
	return out, c.callJSON("GET", "/v1/capabilities", nil, &out)
}

// CheckServer is the capabilities, once the gateway is found to speak this SDK's protocol
// and operator table (an *Error of kind RemoteError saying what differs, otherwise), as
// Python's dx.connect checks.
func (c *Client) CheckServer() (map[string]any, error) {
	caps, err := c.Capabilities()
	if err != nil {
		return nil, err
	}
	if caps["protocol_version"] != ProtocolVersion {
		return nil, &Error{Kind: "RemoteError", Message: fmt.Sprintf("%s speaks %s, this SDK %s",
			c.URL, shown(caps["protocol_version"]), ProtocolVersion)}
	}
	if caps["operator_table_hash"] != OperatorTableHash {
		theirs := map[string]bool{}
		listed, _ := caps["operators"].([]any)
		for _, o := range listed {
			entry, _ := o.(map[string]any)
			theirs[fmt.Sprint(entry["name"])] = true
		}
		var missing, unknown []string
		for name := range operators {
			if !theirs[name] {
				missing = append(missing, name)
			}
		}
		for name := range theirs {
			if _, ok := operators[name]; !ok {
				unknown = append(unknown, name)
			}
		}
		return nil, &Error{Kind: "RemoteError", Message: fmt.Sprintf("%s has another operator "+
			"table than this SDK: missing %s; not in this SDK %s (upgrade one side)", c.URL,
			listedOrNone(missing), listedOrNone(unknown))}
	}
	return caps, nil
}

func listedOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// Analyze is the gateway's analysis of graph (a *Graph, or a spec): every node's shape and
// dtype, and the plan.
func (c *Client) Analyze(graph any) (map[string]any, error) {
	spec, err := specOf(graph)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, c.callJSON("POST", "/v1/graphs:analyze", map[string]any{"graph": spec}, &out)
}

// Execute runs graph on inputs and waits for its outputs (asking for the operation again,
// Poll at a time, while it runs).
func (c *Client) Execute(graph any, inputs map[string]Values, options ...ExecuteOptions) (*Operation, error) {
	op, err := c.execute(graph, inputs, c.Poll, options)
	if err != nil {
		return nil, err
	}
	return c.ended(op)
}

// Start starts running graph on inputs and answers at once: the operation, running (or
// ended already); follow it with GetOperation.
func (c *Client) Start(graph any, inputs map[string]Values, options ...ExecuteOptions) (*Operation, error) {
	return c.execute(graph, inputs, 0, options)
}

func (c *Client) execute(graph any, inputs map[string]Values, wait time.Duration, options []ExecuteOptions) (*Operation, error) {
	spec, err := specOf(graph)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"graph": spec, "wait_seconds": wait.Seconds(),
		"operation_id": newOperationID(), "parameters": map[string]any{"binary_data_output": true}}
	for _, o := range options {
		if o.Outputs != nil {
			body["outputs"] = o.Outputs
		}
		if o.OperationID != "" {
			body["operation_id"] = o.OperationID
		}
	}
	return c.withTensors("/v1/graphs:execute", body, inputs)
}

// ended is op once it is not running: asked for again, Poll at a time.
func (c *Client) ended(op *Operation) (*Operation, error) {
	var err error
	for op.State == "running" {
		if op, err = c.GetOperation(op.Operation, c.Poll); err != nil {
			return nil, err
		}
	}
	return op, nil
}

// Cancel stops a running operation: the operation once it ended.
func (c *Client) Cancel(id string) (*Operation, error) {
	data, length, err := c.call("POST", "/v1/operations/"+url.PathEscape(id)+":cancel", nil, -1)
	if err != nil {
		return nil, err
	}
	return operationOf(data, length)
}

// GetOperation is an operation as the gateway has it now, or once it ends within wait.
func (c *Client) GetOperation(id string, wait time.Duration) (*Operation, error) {
	path := "/v1/operations/" + url.PathEscape(id) + "?binary_data_output=true"
	if wait > 0 {
		path += "&wait_seconds=" + strconv.FormatFloat(wait.Seconds(), 'f', -1, 64)
	}
	data, length, err := c.call("GET", path, nil, -1)
	if err != nil {
		return nil, err
	}
	return operationOf(data, length)
}

// Runs are the runs the gateway's database records, newest first: of one status (running,
// succeeded, failed, interrupted) where status is not "", at most limit (20 where 0).
func (c *Client) Runs(status string, limit int) ([]map[string]any, error) {
	var out struct {
		Runs []map[string]any `json:"runs"`
	}
	query := url.Values{}
	if status != "" {
		query.Set("status", status)
	}
	if limit > 0 {
		query.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/runs"
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	return out.Runs, c.callJSON("GET", path, nil, &out)
}

// Run is one run by its id (or a prefix of it): status, tasks, workers, times, error.
func (c *Client) Run(id string) (map[string]any, error) {
	var out map[string]any
	return out, c.callJSON("GET", "/v1/runs/"+url.PathEscape(id), nil, &out)
}

// Assets are the assets defined through the gateway: name, status, latest version, ...
func (c *Client) Assets() ([]map[string]any, error) {
	var out struct {
		Assets []map[string]any `json:"assets"`
	}
	return out.Assets, c.callJSON("GET", "/v1/assets", nil, &out)
}

// AssetVersions are the stored versions of asset name, newest first.
func (c *Client) AssetVersions(name string) ([]map[string]any, error) {
	var out struct {
		Versions []map[string]any `json:"versions"`
	}
	return out.Versions, c.callJSON("GET", "/v1/assets/"+url.PathEscape(name)+"/versions", nil, &out)
}

// DefineAsset defines (or defines again) asset name computed by graph; options: fields of
// assets:define (dependencies, description, partitions, partition_axis, checks). The asset
// as the gateway lists it.
func (c *Client) DefineAsset(name string, graph any, options map[string]any) (map[string]any, error) {
	spec, err := specOf(graph)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"name": name, "graph": spec}
	for k, v := range options {
		body[k] = v
	}
	var out map[string]any
	return out, c.callJSON("POST", "/v1/assets:define", body, &out)
}

// Materialize makes a new version of asset name (options: partitions, force, upstream,
// operation_id, wait_seconds) and waits for it, asking for the operation again Poll at a
// time while it runs (with wait_seconds given: answers once that passed).
func (c *Client) Materialize(name string, options map[string]any) (*Operation, error) {
	body := map[string]any{"operation_id": newOperationID(), "wait_seconds": c.Poll.Seconds()}
	_, follow := options["wait_seconds"]
	follow = !follow
	for k, v := range options {
		body[k] = v
	}
	text, err := json.Marshal(body)
	if err != nil {
		return nil, &Error{Kind: "InputError", Message: err.Error()}
	}
	data, length, err := c.call("POST", "/v1/assets/"+url.PathEscape(name)+":materialize", text, -1)
	if err != nil {
		return nil, err
	}
	op, err := operationOf(data, length)
	if err != nil || !follow {
		return op, err
	}
	return c.ended(op)
}

// ReadAsset is the newest usable version of asset name (options: version, partition, slice).
func (c *Client) ReadAsset(name string, options map[string]any) (Values, error) {
	body := map[string]any{"parameters": map[string]any{"binary_data_output": true}}
	for k, v := range options {
		body[k] = v
	}
	text, _ := json.Marshal(body)
	data, length, err := c.call("POST", "/v1/assets/"+url.PathEscape(name)+":read", text, -1)
	if err != nil {
		return Values{}, err
	}
	op, err := operationOf(data, length)
	if err != nil {
		return Values{}, err
	}
	return op.Outputs[name], nil
}

// Infer calls served model (the Open Inference Protocol's infer) on inputs.
func (c *Client) Infer(model string, inputs map[string]Values) (*Operation, error) {
	return c.InferVersion(model, "", inputs)
}

// InferVersion calls one version of served model ("": the model's policy chooses).
func (c *Client) InferVersion(model, version string, inputs map[string]Values) (*Operation, error) {
	body := map[string]any{"parameters": map[string]any{"binary_data_output": true}}
	path := "/v2/models/" + url.PathEscape(model)
	if version != "" {
		path += "/versions/" + url.PathEscape(version)
	}
	return c.withTensors(path+"/infer", body, inputs)
}

func (c *Client) withTensors(path string, body map[string]any, inputs map[string]Values) (*Operation, error) {
	var listed []map[string]any
	var raw bytes.Buffer
	for name, v := range inputs {
		b, err := v.raw()
		if err != nil {
			err.(*Error).Message = fmt.Sprintf("input %s: %s", shown(name), err.(*Error).Message)
			return nil, err
		}
		listed = append(listed, map[string]any{"name": name, "datatype": datatypes[v.Dtype],
			"shape": v.Shape, "parameters": map[string]any{"binary_data_size": len(b)}})
		raw.Write(b)
	}
	if listed == nil {
		listed = []map[string]any{}
	}
	body["inputs"] = listed
	head, err := json.Marshal(body)
	if err != nil {
		return nil, &Error{Kind: "InputError", Message: err.Error()}
	}
	data, length, err := c.call("POST", path, append(head, raw.Bytes()...), len(head))
	if err != nil {
		return nil, err
	}
	return operationOf(data, length)
}

func (c *Client) callJSON(method, path string, body any, out any) error {
	var text []byte
	if body != nil {
		var err error
		if text, err = json.Marshal(body); err != nil {
			return &Error{Kind: "InputError", Message: err.Error()}
		}
	}
	data, _, err := c.call(method, path, text, -1)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &Error{Kind: "RemoteError", Message: "the gateway's answer is not JSON: " + err.Error()}
	}
	return nil
}

func (c *Client) call(method, path string, body []byte, jsonLength int) ([]byte, int, error) {
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	request, err := http.NewRequest(method, c.URL+path, reader)
	if err != nil {
		return nil, -1, &Error{Kind: "InputError", Message: err.Error()}
	}
	request.Header.Set("Content-Type", "application/json")
	if jsonLength >= 0 {
		request.Header.Set("Content-Type", "application/octet-stream")
		request.Header.Set(headerLength, strconv.Itoa(jsonLength))
	}
	if c.Token != "" {
		request.Header.Set("Authorization", "Bearer "+c.Token)
	}
	answer, err := c.HTTP.Do(request)
	if err != nil {
		return nil, -1, &Error{Kind: "RemoteError", Message: fmt.Sprintf("cannot reach the gateway at %s: %v", c.URL, err)}
	}
	defer answer.Body.Close()
	data, err := io.ReadAll(answer.Body)
	if err != nil {
		return nil, -1, &Error{Kind: "RemoteError", Message: err.Error()}
	}
	if answer.StatusCode >= 400 {
		said := struct {
			Error string `json:"error"`
			Kind  string `json:"kind"`
		}{}
		message, kind := string(data), kindOfStatus[answer.StatusCode]
		if json.Unmarshal(data, &said) == nil && said.Error != "" {
			message = said.Error
			if said.Kind != "" {
				kind = said.Kind
			}
		}
		if kind == "" {
			kind = "RemoteError"
		}
		return nil, -1, &Error{Kind: kind, Message: message, Status: answer.StatusCode}
	}
	length := -1
	if text := answer.Header.Get(headerLength); text != "" {
		if length, err = strconv.Atoi(text); err != nil || length > len(data) {
			return nil, -1, &Error{Kind: "RemoteError", Message: "the gateway sent a bad " + headerLength}
		}
	}
	return data, length, nil
}

func operationOf(data []byte, length int) (*Operation, error) {
	head := data
	if length >= 0 {
		head = data[:length]
	}
	var fields map[string]any
	if err := json.Unmarshal(head, &fields); err != nil {
		return nil, &Error{Kind: "RemoteError", Message: "the gateway's answer is not JSON: " + err.Error()}
	}
	op := &Operation{Fields: fields, Outputs: map[string]Values{}}
	op.State, _ = fields["state"].(string)
	op.Operation, _ = fields["operation"].(string)
	op.RunID, _ = fields["run_id"].(string)
	op.Error, _ = fields["error"].(string)
	op.Dashboard, _ = fields["dashboard"].(string)
	if p, ok := fields["progress"].(map[string]any); ok {
		done, _ := p["tasks_done"].(float64)
		total, _ := p["tasks_total"].(float64)
		op.Progress = &Progress{TasksDone: int(done), TasksTotal: int(total)}
	}
	listed, _ := fields["outputs"].([]any)
	at := len(data)
	if length >= 0 {
		at = length
	}
	for _, item := range listed {
		entry, _ := item.(map[string]any)
		name, _ := entry["name"].(string)
		datatype, _ := entry["datatype"].(string)
		shape := []int{}
		listedShape, _ := entry["shape"].([]any)
		for _, d := range listedShape {
			extent, _ := d.(float64)
			shape = append(shape, int(extent))
		}
		params, _ := entry["parameters"].(map[string]any)
		sizeOf, ok := params["binary_data_size"].(float64)
		if !ok || at+int(sizeOf) > len(data) {
			return nil, &Error{Kind: "RemoteError", Message: fmt.Sprintf("output %s came without its binary data", shown(name))}
		}
		dtype := ""
		for d, w := range datatypes {
			if w == datatype {
				dtype = d
			}
		}
		v, err := fromRaw(dtype, shape, data[at:at+int(sizeOf)])
		if err != nil {
			return nil, err
		}
		at += int(sizeOf)
		op.Outputs[name] = v
	}
	return op, nil
}
