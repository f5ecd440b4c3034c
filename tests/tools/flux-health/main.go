// Command flux-health evaluates a Flux Kustomization's healthCheckExprs entry on one object the
// way kustomize-controller (Flux >= 2.5) does: the expressions are parsed, not type-checked,
// in a CEL environment with the options Flux's runtime/cel package sets; the object's
// top-level fields (metadata, spec, status, ...) are the variables; an object whose
// status.observedGeneration differs from metadata.generation is InProgress before any
// expression runs; then inProgress, failed and current are tried in that order and the first
// that is true wins; none true means InProgress. An evaluation error (e.g. a field the object
// does not have yet) is what Flux's status reader reports as Unknown: the Kustomization keeps
// waiting. raypipe's tests use it on status objects its controller wrote.
//
// Input (stdin): {"current": "...", "inProgress": "...", "failed": "...", "object": {...}}
// Output (stdout): {"status": "Current|InProgress|Failed|Unknown", "message": "..."}
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
)

type input struct {
	Current    string          `json:"current"`
	InProgress string          `json:"inProgress"`
	Failed     string          `json:"failed"`
	Object     json.RawMessage `json:"object"`
}

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// program parses one expression in Flux's environment (no declarations: parse only).
func program(expr string) (cel.Program, error) {
	env, err := cel.NewEnv(
		cel.HomogeneousAggregateLiterals(),
		cel.EagerlyValidateDeclarations(true),
		cel.DefaultUTCTimeZone(true),
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Sets(),
		ext.Encoders(),
	)
	if err != nil {
		return nil, err
	}
	ast, issues := env.Parse(expr)
	if issues != nil && issues.Err() != nil {
		return nil, fmt.Errorf("parsing %q: %s", expr, issues.String())
	}
	return env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.InterruptCheckFrequency(100))
}

// unstructured turns json.Number leaves into int64 where they are integers and float64
// otherwise, as Kubernetes' unstructured decoding does (CEL sees ints, not doubles).
func unstructured(value interface{}) interface{} {
	switch v := value.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case []interface{}:
		for i := range v {
			v[i] = unstructured(v[i])
		}
		return v
	case map[string]interface{}:
		for k := range v {
			v[k] = unstructured(v[k])
		}
		return v
	}
	return value
}

func evaluate(in input) (verdict, error) {
	if in.Current == "" {
		return verdict{}, fmt.Errorf("the current expression is required")
	}
	decoder := json.NewDecoder(bytes.NewReader(in.Object))
	decoder.UseNumber()
	var raw map[string]interface{}
	if err := decoder.Decode(&raw); err != nil {
		return verdict{}, fmt.Errorf("reading the object: %w", err)
	}
	object := unstructured(raw).(map[string]interface{})

	if status, ok := object["status"].(map[string]interface{}); ok {
		if observed, ok := status["observedGeneration"].(int64); ok {
			if metadata, ok := object["metadata"].(map[string]interface{}); ok {
				if generation, ok := metadata["generation"].(int64); ok && generation != observed {
					return verdict{Status: "InProgress", Message: "observedGeneration differs from generation"}, nil
				}
			}
		}
	}

	for _, step := range []struct {
		expr   string
		status string
	}{
		{in.InProgress, "InProgress"},
		{in.Failed, "Failed"},
		{in.Current, "Current"},
	} {
		if step.expr == "" {
			continue
		}
		prog, err := program(step.expr)
		if err != nil {
			return verdict{}, err
		}
		value, _, err := prog.ContextEval(context.Background(), object)
		if err != nil {
			return verdict{Status: "Unknown", Message: err.Error()}, nil
		}
		result, ok := value.(types.Bool)
		if !ok {
			return verdict{Status: "Unknown", Message: fmt.Sprintf("%s is not a boolean", step.status)}, nil
		}
		if bool(result) {
			return verdict{Status: step.status, Message: step.status + " expression is true"}, nil
		}
	}
	return verdict{Status: "InProgress", Message: "no expression is true"}, nil
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "reading the input:", err)
		os.Exit(2)
	}
	out, err := evaluate(in)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
