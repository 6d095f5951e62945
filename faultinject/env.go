package faultinject

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase"
)

// EnvVar is the environment variable FromEnv reads.
const EnvVar = "ATOMICPHASE_FAULTS"

// Parse reads rules written as a comma-separated list of
//
//	[WORKFLOW/]PHASE:PLACE:ACTION[:ARG]
//
// PHASE is a phase name, or * for any phase (use * with before-acquire and
// after-acquire, which belong to no phase). PLACE is one of before-acquire,
// after-acquire, before-phase, after-foreign, before-response,
// before-commit, after-commit. ACTION is one of crash, error, panic, delay,
// terminate-backend, lose-commit-ack, lose-take-ack, slow-call,
// drop-after-request, exit. ARG is the delay or slow-call action's
// duration (a Go duration such as 2s; defaults 10ms and 1s). Every rule
// fires once.
//
//	charge:after-foreign:exit
//	create_ride/create_ride:before-commit:delay:5s,*:after-acquire:crash
func Parse(spec string) ([]Rule, error) {
	var rules []Rule
	var errs []error
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		r, err := parseRule(item)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", item, err))
			continue
		}
		rules = append(rules, r)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("faultinject: %s: want [WORKFLOW/]PHASE:PLACE:ACTION[:ARG]: %w", EnvVar, errors.Join(errs...))
	}
	return rules, nil
}

func parseRule(item string) (Rule, error) {
	parts := strings.Split(item, ":")
	if len(parts) < 3 || len(parts) > 4 {
		return Rule{}, errors.New("needs 3 or 4 colon-separated fields")
	}
	var r Rule
	phase := parts[0]
	if wf, p, ok := strings.Cut(phase, "/"); ok {
		r.Workflow, phase = wf, p
		if wf == "" {
			return Rule{}, errors.New("empty workflow before /")
		}
	}
	switch phase {
	case "":
		return Rule{}, errors.New("empty phase (use * for any phase)")
	case "*":
	default:
		r.Phase = phase
	}
	r.Place = atomicphase.FaultPlace(parts[1])
	if !slices.Contains(atomicphase.FaultPlaces(), r.Place) {
		return Rule{}, fmt.Errorf("unknown place %q (one of %s)", parts[1], joinPlaces())
	}
	r.Action = Action(parts[2])
	if !slices.Contains(Actions, r.Action) {
		return Rule{}, fmt.Errorf("unknown action %q (one of %s)", parts[2], joinActions())
	}
	if len(parts) == 4 {
		if r.Action != Delay && r.Action != SlowCall {
			return Rule{}, fmt.Errorf("action %s takes no argument", r.Action)
		}
		d, err := time.ParseDuration(parts[3])
		if err != nil || d < 0 {
			return Rule{}, fmt.Errorf("delay %q is not a duration such as 2s", parts[3])
		}
		r.Delay = d
	}
	return r, nil
}

// FromEnv returns an Injector built from ATOMICPHASE_FAULTS, or nil (and no
// error) when the variable is unset or empty. A malformed value is an error
// naming the offending rule: check it at start-up.
func FromEnv() (*Injector, error) {
	spec := os.Getenv(EnvVar)
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	rules, err := Parse(spec)
	if err != nil {
		return nil, err
	}
	return New(rules...), nil
}

func joinPlaces() string {
	places := atomicphase.FaultPlaces()
	s := make([]string, len(places))
	for i, p := range places {
		s[i] = string(p)
	}
	return strings.Join(s, ", ")
}

func joinActions() string {
	s := make([]string, len(Actions))
	for i, a := range Actions {
		s[i] = string(a)
	}
	return strings.Join(s, ", ")
}
