package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/deepx-flow/deepx-go/deepx"
)

// call is one call of a scenario (sdks/conformance/make_scenarios.py lists them by "do").
type call struct {
	Do       string            `json:"do"`
	Asset    string            `json:"asset"`
	Graph    *testCase         `json:"graph"`
	State    string            `json:"state"`
	Includes []string          `json:"includes"`
	AtLeast  int               `json:"at_least"`
	Model    string            `json:"model"`
	Follow   bool              `json:"follow"`
	Inputs   map[string]tensor `json:"inputs"`
	Expected any               `json:"expected"` // one tensor (read_asset), or by name
	Rtol     float64           `json:"rtol"`
	Atol     float64           `json:"atol"`
	Error    *refusal          `json:"error"`

	Analysis        map[string][]map[string]any `json:"analysis"` // (inputs, outputs)
	ProtocolVersion string                      `json:"protocol_version"`
	TableHash       string                      `json:"operator_table_hash"`
}

func runScenario(c testCase, client *deepx.Client) error {
	for i, step := range c.Scenario {
		if err := makeCall(step, client); err != nil {
			return fmt.Errorf("call %d (%s): %v", i+1, step.Do, err)
		}
	}
	return nil
}

// graphOf builds a call's graph through the SDK, which must give the stored spec.
func graphOf(step call) (*deepx.Graph, error) {
	g, err := built(*step.Graph)
	if err != nil {
		return nil, err
	}
	return g, sameSpec(g, step.Graph.Spec)
}

func inputsOf(given map[string]tensor) map[string]deepx.Values {
	out := map[string]deepx.Values{}
	for name, t := range given {
		out[name] = values(t)
	}
	return out
}

// expected is a call's expected tensors by name (read_asset's one under its asset's name).
func expected(step call) (map[string]tensor, error) {
	text, _ := json.Marshal(step.Expected)
	var one tensor
	if err := json.Unmarshal(text, &one); err == nil && one.Dtype != "" {
		return map[string]tensor{step.Asset: one}, nil
	}
	var named map[string]tensor
	return named, json.Unmarshal(text, &named)
}

func compareAll(got map[string]deepx.Values, step call) error {
	want, err := expected(step)
	if err != nil {
		return err
	}
	for name, t := range want {
		if err := compare(got[name], values(t), step.Rtol, step.Atol, name); err != nil {
			return err
		}
	}
	return nil
}

func makeCall(step call, client *deepx.Client) error {
	switch step.Do {
	case "define_asset":
		g, err := graphOf(step)
		if err != nil {
			return err
		}
		_, err = client.DefineAsset(step.Asset, g, nil)
		return err
	case "materialize":
		done, err := client.Materialize(step.Asset, nil)
		if err != nil {
			return err
		}
		if done.State != step.State {
			return fmt.Errorf("%s: %s (%s)", step.Asset, done.State, done.Error)
		}
	case "read_asset":
		got, err := client.ReadAsset(step.Asset, nil)
		if err != nil {
			return err
		}
		return compareAll(map[string]deepx.Values{step.Asset: got}, step)
	case "list_assets":
		assets, err := client.Assets()
		if err != nil {
			return err
		}
		listed := map[string]bool{}
		for _, a := range assets {
			listed[fmt.Sprint(a["name"])] = true
		}
		for _, name := range step.Includes {
			if !listed[name] {
				return fmt.Errorf("%s is not listed", name)
			}
		}
	case "asset_versions":
		versions, err := client.AssetVersions(step.Asset)
		if err != nil {
			return err
		}
		if len(versions) < step.AtLeast {
			return fmt.Errorf("%d versions of %s", len(versions), step.Asset)
		}
	case "execute":
		return execute(step, client)
	case "infer":
		done, err := client.Infer(step.Model, inputsOf(step.Inputs))
		if step.Error != nil {
			return refused(err, step.Error)
		}
		if err != nil {
			return err
		}
		return compareAll(done.Outputs, step)
	case "analyze":
		g, err := graphOf(step)
		if err != nil {
			return err
		}
		answer, err := client.Analyze(g)
		if err != nil {
			return err
		}
		for _, side := range []struct {
			name string
			want []map[string]any
		}{{"inputs", step.Analysis["inputs"]}, {"outputs", step.Analysis["outputs"]}} {
			got, _ := json.Marshal(answer[side.name])
			want, _ := json.Marshal(side.want)
			if string(got) != string(want) {
				return fmt.Errorf("the %s: %s, not %s", side.name, got, want)
			}
		}
		if plan, _ := answer["plan"].(string); plan == "" {
			return fmt.Errorf("no plan")
		}
		if tasks, _ := answer["tasks"].(float64); tasks < 1 {
			return fmt.Errorf("tasks %v", answer["tasks"])
		}
	case "cancel_ended":
		g, err := graphOf(step)
		if err != nil {
			return err
		}
		done, err := client.Execute(g, inputsOf(step.Inputs))
		if err != nil {
			return err
		}
		if done.State != "succeeded" {
			return fmt.Errorf("%s: %s", done.State, done.Error)
		}
		cancelled, err := client.Cancel(done.Operation)
		if err != nil {
			return err
		}
		if cancelled.State != "succeeded" || len(cancelled.Outputs) != 0 {
			return fmt.Errorf("cancelled after its end: %s with %d outputs", cancelled.State, len(cancelled.Outputs))
		}
		again, err := client.GetOperation(done.Operation, 0)
		if err != nil {
			return err
		}
		for name, want := range done.Outputs {
			if err := compare(again.Outputs[name], want, 0, 0, name); err != nil {
				return err
			}
		}
	case "check_server":
		if deepx.ProtocolVersion != step.ProtocolVersion || deepx.OperatorTableHash != step.TableHash {
			return fmt.Errorf("this SDK: %s %s", deepx.ProtocolVersion, deepx.OperatorTableHash)
		}
		caps, err := client.CheckServer()
		if err != nil {
			return err
		}
		if caps["operator_table_hash"] != step.TableHash {
			return fmt.Errorf("the gateway's hash: %v", caps["operator_table_hash"])
		}
	case "cancel":
		g, err := graphOf(step)
		if err != nil {
			return err
		}
		started, err := client.Start(g, inputsOf(step.Inputs))
		if err != nil {
			return err
		}
		if started.State != "running" {
			return fmt.Errorf("started: %s", started.State)
		}
		done, err := client.Cancel(started.Operation)
		if err != nil {
			return err
		}
		if done.State != "interrupted" || !strings.Contains(done.Error, "cancelled") {
			return fmt.Errorf("cancelled: %s (%s)", done.State, done.Error)
		}
		run, err := client.Run(done.RunID)
		if err != nil {
			return err
		}
		if run["status"] != "interrupted" {
			return fmt.Errorf("its run: %v", run["status"])
		}
	default:
		return fmt.Errorf("no such call")
	}
	return nil
}

// execute runs a call's graph; with Follow, it starts it and asks again until it ends, and
// checks what following a run shows: progress, the dashboard link, the run in the catalog.
func execute(step call, client *deepx.Client) error {
	g, err := graphOf(step)
	if err != nil {
		return err
	}
	if !step.Follow {
		done, err := client.Execute(g, inputsOf(step.Inputs))
		if err != nil {
			return err
		}
		if done.State != "succeeded" {
			return fmt.Errorf("%s: %s", done.State, done.Error)
		}
		return compareAll(done.Outputs, step)
	}
	done, err := client.Start(g, inputsOf(step.Inputs))
	for err == nil && done.State == "running" {
		done, err = client.GetOperation(done.Operation, time.Second)
	}
	if err != nil {
		return err
	}
	if done.State != "succeeded" {
		return fmt.Errorf("%s: %s", done.State, done.Error)
	}
	if p := done.Progress; p == nil || p.TasksTotal == 0 || p.TasksDone != p.TasksTotal {
		return fmt.Errorf("progress %+v", done.Progress)
	}
	if !strings.HasSuffix(done.Dashboard, "/run?id="+done.RunID) {
		return fmt.Errorf("dashboard %q", done.Dashboard)
	}
	run, err := client.Run(done.RunID)
	if err != nil {
		return err
	}
	if run["status"] != "succeeded" {
		return fmt.Errorf("its run: %v", run["status"])
	}
	runs, err := client.Runs("", 100)
	if err != nil {
		return err
	}
	listed := false
	for _, r := range runs {
		listed = listed || r["id"] == done.RunID
	}
	if !listed {
		return fmt.Errorf("the run %s is not listed", done.RunID)
	}
	return compareAll(done.Outputs, step)
}
