// dashboardcheck checks a Grafana dashboard JSON file with Grafana's own
// schema (github.com/grafana/grafana-foundation-sdk/go: the dashboard and
// panel types generated from Grafana's schemas, with every panel and
// datasource plugin Grafana ships registered): a strict unmarshal (an
// unknown or mistyped field is an error) and Validate(). Then it prints one
// JSON line per Prometheus query the dashboard runs, its panels' targets and
// its query variables, for the test to run against Prometheus:
//
//	{"panel": "Steps per second", "refId": "A", "expr": "..."}
//
// usage: dashboardcheck DASHBOARD.json
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

type query struct {
	Panel string `json:"panel"`
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// failed reports whether err holds errors: Validate() and the strict
// unmarshal return a cog.BuildErrors, which is a non-nil error even when the
// list is empty.
func failed(err error) bool {
	var list cog.BuildErrors
	if errors.As(err, &list) {
		return len(list) > 0
	}
	return err != nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboardcheck DASHBOARD.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := d.UnmarshalJSONStrict(raw); failed(err) {
		fmt.Fprintf(os.Stderr, "%s: not a dashboard by Grafana's schema: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	if err := d.Validate(); failed(err) {
		fmt.Fprintf(os.Stderr, "%s: invalid by Grafana's schema: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	// The SDK's PanelOrRowPanel.UnmarshalJSONStrict treats the empty error
	// list a panel's own strict unmarshal returns as a failure and keeps
	// neither variant, so the dashboard's Panels come back empty: each panel
	// is decoded and validated here on its own, as a Panel or a RowPanel
	// (and the panels inside a collapsed row), by the same generated code.
	var top struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	n, panels := 0, 0
	var problems []string
	var check func(where string, raw json.RawMessage)
	check = func(where string, raw json.RawMessage) {
		panels++
		var head struct {
			Type   string            `json:"type"`
			Panels []json.RawMessage `json:"panels"`
		}
		_ = json.Unmarshal(raw, &head)
		if head.Type == "row" {
			var r dashboard.RowPanel
			if err := r.UnmarshalJSONStrict(raw); failed(err) {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			} else if err := r.Validate(); failed(err) {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			}
			for i, inner := range head.Panels {
				check(fmt.Sprintf("%s.panels[%d]", where, i), inner)
			}
			return
		}
		var p dashboard.Panel
		if err := p.UnmarshalJSONStrict(raw); failed(err) {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			return
		}
		if err := p.Validate(); failed(err) {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
		}
		title := ""
		if p.Title != nil {
			title = *p.Title
		}
		// The same bug drops every target (a Dataquery's strict unmarshal
		// returns an empty error list too): each is decoded here.
		var targets struct {
			Targets []json.RawMessage `json:"targets"`
		}
		_ = json.Unmarshal(raw, &targets)
		for i, t := range targets.Targets {
			var q prometheus.Dataquery
			if err := q.UnmarshalJSONStrict(t); failed(err) {
				problems = append(problems, fmt.Sprintf("%s (%q): targets[%d] is not a Prometheus query: %v", where, title, i, err))
				continue
			}
			if err := q.Validate(); failed(err) {
				problems = append(problems, fmt.Sprintf("%s (%q): targets[%d]: %v", where, title, i, err))
			}
			ref := ""
			if q.RefId != nil {
				ref = *q.RefId
			}
			_ = out.Encode(query{Panel: title, RefID: ref, Expr: q.Expr})
			n++
		}
	}
	for i, p := range top.Panels {
		check(fmt.Sprintf("panels[%d]", i), p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "%s: invalid by Grafana's schema:\n  %s\n", os.Args[1], strings.Join(problems, "\n  "))
		os.Exit(1)
	}
	// The query variables' queries run too.
	var vars struct {
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	_ = json.Unmarshal(raw, &vars)
	for _, v := range vars.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
			_ = out.Encode(query{Panel: "variable " + v.Name, RefID: v.Name, Expr: q.Query})
			n++
		}
	}
	fmt.Fprintf(os.Stderr, "%s: valid by Grafana's schema (grafana-foundation-sdk); %d panels, %d queries\n",
		os.Args[1], panels, n)
}
