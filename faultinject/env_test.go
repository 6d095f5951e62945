package faultinject_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
	"github.com/atomicphase/atomicphase/faultinject"
)

func TestParse(t *testing.T) {
	t.Parallel()
	rules, err := faultinject.Parse("charge:after-foreign:exit, shop/create_order:before-commit:delay:2s,*:after-acquire:crash")
	require.NoError(t, err)
	require.Equal(t, []faultinject.Rule{
		{Phase: "charge", Place: atomicphase.AfterForeign, Action: faultinject.Exit},
		{Workflow: "shop", Phase: "create_order", Place: atomicphase.BeforeCommit, Action: faultinject.Delay, Delay: 2 * time.Second},
		{Place: atomicphase.AfterAcquire, Action: faultinject.Crash},
	}, rules)

	rules, err = faultinject.Parse("")
	require.NoError(t, err)
	require.Empty(t, rules)
}

func TestParseRejectsMalformedRules(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"charge:after-foreign":            "3 or 4 colon-separated fields",
		"charge:after-foreign:exit:1:2":   "3 or 4 colon-separated fields",
		":after-foreign:exit":             "empty phase",
		"/charge:after-foreign:exit":      "empty workflow",
		"charge:during-lunch:exit":        `unknown place "during-lunch"`,
		"charge:after-foreign:explode":    `unknown action "explode"`,
		"charge:after-foreign:crash:5s":   "takes no argument",
		"charge:after-foreign:delay:soon": "not a duration",
		"charge:after-foreign:exit,oops":  `"oops"`,
	}
	for spec, want := range cases {
		_, err := faultinject.Parse(spec)
		require.ErrorContains(t, err, want, spec)
		require.ErrorContains(t, err, faultinject.EnvVar, "the error names the variable")
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv(faultinject.EnvVar, "")
	inj, err := faultinject.FromEnv()
	require.NoError(t, err)
	require.Nil(t, inj)

	t.Setenv(faultinject.EnvVar, "charge:after-foreign:error")
	inj, err = faultinject.FromEnv()
	require.NoError(t, err)
	require.NotNil(t, inj)

	t.Setenv(faultinject.EnvVar, "nonsense")
	_, err = faultinject.FromEnv()
	require.Error(t, err)
}
