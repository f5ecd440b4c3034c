// Command argocd-health evaluates an Argo CD resource health script on one object, the way
// Argo CD does: with gopher-lua, the object (JSON on stdin) as the global `obj`, and the
// script's returned table read as {status, message}. raypipe's tests use it to check
// deploy/argocd/servepipeline-health.lua on status objects its controller wrote.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	lua "github.com/yuin/gopher-lua"
)

func toLua(state *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []interface{}:
		table := state.NewTable()
		for _, item := range v {
			table.Append(toLua(state, item))
		}
		return table
	case map[string]interface{}:
		table := state.NewTable()
		for key, item := range v {
			table.RawSetString(key, toLua(state, item))
		}
		return table
	}
	return lua.LNil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health SCRIPT.lua < object.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var object map[string]interface{}
	if err := json.NewDecoder(os.Stdin).Decode(&object); err != nil {
		fmt.Fprintln(os.Stderr, "reading the object:", err)
		os.Exit(2)
	}
	state := lua.NewState()
	defer state.Close()
	state.SetGlobal("obj", toLua(state, object))
	if err := state.DoString(string(script)); err != nil {
		fmt.Fprintln(os.Stderr, "the script failed:", err)
		os.Exit(1)
	}
	result, ok := state.Get(-1).(*lua.LTable)
	if !ok {
		fmt.Fprintln(os.Stderr, "the script did not return a table")
		os.Exit(1)
	}
	out := map[string]string{
		"status":  result.RawGetString("status").String(),
		"message": result.RawGetString("message").String(),
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
