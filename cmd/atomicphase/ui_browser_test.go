package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// The console as `atomicphase ui` serves it (the command itself: its
// options, its host allowlist, its token), in headless Chromium, each
// action taken by clicking its form. The test skips when no Chromium is
// installed, and fails instead in CI (CI=true), which installs it
// (scripts/ensure-chromium).

// chromiumPath finds the browser, or skips (fails in CI) without one.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium on PATH (chromium, chromium-browser, google-chrome): install it with " +
		"`apt-get install -y chromium` or run scripts/ensure-chromium to run the browser tests"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// browser starts a headless Chromium for the test and returns its context.
func browser(t *testing.T) context.Context {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true))
	ctx, cancel := chromedp.NewContext(actx)
	// A bound on the whole browser session, so that a hung browser fails
	// the test instead of the suite's timeout; nothing is timed.
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Run(ctx), "start Chromium")
	return ctx
}

// consoleKeys gives the test a database holding, built by a process that
// registered the workflows (the ui command has not):
//
//	bob/parked-1..3, dave/parked-4, erin/parked-5..6   payout  parked (a permanent failure)
//	frank/unknown-1                                    label   unknown: the call failed, reconcile cannot tell
//
// and returns the downstream key the label call was sent with.
func consoleKeys(t *testing.T) (*testBundle, string) {
	t.Helper()
	b := setupEmpty(t, nil)
	// The label call fails without acting: nothing of it is in flight, and
	// an operator may give a verdict at once (Config.CallGrace).
	service, err := atomicphase.NewRunner(b.db.Pool, &atomicphase.Config{CallGrace: time.Nanosecond})
	require.NoError(t, err)
	type state struct{ Item string }
	start := func(_ struct{}, req *atomicphase.Request) (state, error) { return state{Item: req.Key}, nil }
	respond := func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
		return atomicphase.Respond(201, []byte(`{}`)), nil
	}
	var labelRef string
	workflows := map[string]*atomicphase.Workflow[state]{
		"payout": atomicphase.MustWorkflow("payout", start, []atomicphase.Phase[state]{
			atomicphase.Local("payout", func(context.Context, atomicphase.Tx, *state) (atomicphase.Outcome, error) {
				return atomicphase.Outcome{}, atomicphase.Permanent(errors.New("account closed"))
			})}, nil),
		"label": atomicphase.MustWorkflow("label", start, []atomicphase.Phase[state]{
			atomicphase.Foreign("buy_label", func(ctx context.Context, call *atomicphase.ForeignCall, _ *state) error {
				return call.Do(ctx, func(_ context.Context, ref string) error {
					labelRef = ref
					return errors.New("label service: connection reset")
				})
			}, nil).WithReconcile(func(context.Context, *atomicphase.ForeignCall, *state) (bool, error) {
				return false, errors.New("label lookup is down")
			}),
			atomicphase.Local("confirm", respond)}, nil),
	}
	for _, k := range []struct{ workflow, scope, key string }{
		{"payout", "bob", "parked-1"}, {"payout", "bob", "parked-2"}, {"payout", "bob", "parked-3"}, {"payout", "dave", "parked-4"},
		{"payout", "erin", "parked-5"}, {"payout", "erin", "parked-6"}, {"label", "frank", "unknown-1"},
	} {
		_, _ = service.Run(b.ctx, workflows[k.workflow], atomicphase.Request{Scope: k.scope, Key: k.key, Method: "POST", Path: "/" + k.workflow})
	}
	require.Equal(t, atomicphase.KeyUnknown, b.inspect(t, "frank", "unknown-1").Status)
	require.NotEmpty(t, labelRef)
	return b, labelRef
}

// crossSitePage is another origin's page with a form that unparks a key
// of the console at %[2]s, under the referrer policy %[1]s.
const crossSitePage = `<!doctype html><meta name="referrer" content="%[1]s">
<form method="post" action="%[2]skey"><input name="action" value="unpark"><input name="scope" value="dave">
<input name="key" value="parked-4"><input name="csrf" value="guessed"><button id="go">go</button></form>`

// act opens a page of the console, runs fill (the form's fields), clicks
// the button and returns the text of the page the browser ends on: the
// console's page, or the text of a refusal.
func act(t *testing.T, ctx context.Context, url string, fill chromedp.Tasks, button string) string {
	t.Helper()
	if url != "" {
		require.NoError(t, chromedp.Run(ctx, chromedp.Navigate(url)))
	}
	var txt string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.WaitVisible(button, chromedp.ByQuery),
		fill,
		// The page the click leaves is marked: the wait is for another.
		chromedp.Evaluate(`document.body.dataset.left = "yes"`, nil),
		chromedp.Click(button, chromedp.ByQuery),
		chromedp.WaitNotPresent(`body[data-left]`, chromedp.ByQuery),
		chromedp.WaitReady("body", chromedp.ByQuery),
		chromedp.Evaluate(`document.body.innerText`, &txt)))
	return txt
}

// Every action the console's pages offer, clicked in Chromium against the
// ui command with its defaults (the hosts it answers to, a token): each
// must reach the key table. The browser sends the page's origin with each
// form (Referrer-Policy: same-origin), which the command's allowlist
// accepts; Origin "null", which no-referrer made it send, was refused.
func TestUIActionsInABrowser(t *testing.T) {
	t.Parallel()
	b, labelRef := consoleKeys(t)
	base, stop := serveUI(t, b, "--token", uiToken)
	ctx := browser(t)
	// What the browser sends once its basic-auth prompt has the token.
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("operator:"+uiToken))
	require.NoError(t, chromedp.Run(ctx, network.Enable(), network.SetExtraHTTPHeaders(network.Headers{"Authorization": auth})))

	// Another origin's form is still refused, whatever its page's policy
	// makes the browser send (its origin, or "null"), with the operator's
	// credentials on it: a page on another port of the same address.
	for _, policy := range []string{"strict-origin-when-cross-origin", "no-referrer"} {
		attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, crossSitePage, policy, base)
		}))
		txt := act(t, ctx, attacker.URL, nil, "#go")
		attacker.Close()
		require.Contains(t, txt, "refused", policy)
		require.Equal(t, atomicphase.KeyParked, b.inspect(t, "dave", "parked-4").Status, policy)
	}

	// Unpark: the key waits for the sweep.
	txt := act(t, ctx, base+"key?scope=bob&key=parked-1", nil, "#unpark")
	require.Contains(t, txt, "Unparked: the next sweep resumes the key.")
	require.Equal(t, atomicphase.KeyAbandoned, b.inspect(t, "bob", "parked-1").Status)

	// Resume: this process has not the workflow's code, so it schedules.
	txt = act(t, ctx, base+"key?scope=bob&key=parked-2", nil, "#resume")
	require.Contains(t, txt, "Scheduled: the next sweep of a process that registered the key's workflow resumes it.")
	require.Nil(t, b.inspect(t, "bob", "parked-2").ParkedAt)

	// The standalone page knows the phases and the downstream key from
	// the versions registry, then records the operator's verdict.
	require.NoError(t, chromedp.Run(ctx, chromedp.Navigate(base+"key?scope=frank&key=unknown-1"),
		chromedp.WaitVisible("#phases", chromedp.ByID), chromedp.Text("main", &txt, chromedp.ByQuery)))
	require.Contains(t, txt, "buy_label\nconfirm")
	require.Contains(t, txt, "buy_label\t"+labelRef, "the reference the label service was sent")
	txt = act(t, ctx, "", chromedp.Tasks{
		chromedp.SetValue("#happened", "true", chromedp.ByID),
		chromedp.SendKeys("#note", "label support confirmed lbl-1", chromedp.ByID),
		chromedp.SendKeys("#result", `"lbl-1"`, chromedp.ByID),
	}, "#resolve-button")
	require.Contains(t, txt, "Verdict recorded")
	k := b.inspect(t, "frank", "unknown-1")
	require.NotNil(t, k.ResolvedHappened)
	require.True(t, *k.ResolvedHappened)
	require.JSONEq(t, `"lbl-1"`, string(k.ResolvedResult))

	// Forget a parked key (its phase made no call).
	txt = act(t, ctx, base+"key?scope=erin&key=parked-5", nil, "#forget")
	require.Contains(t, txt, "Forgotten: the key and its stored response are deleted.")
	require.False(t, b.keyExists(t, "parked-5"))

	// The bulk actions: a dry run that changes nothing, then the
	// confirmation.
	for _, c := range []struct {
		action, filter string
		check          func()
	}{
		{"unpark", "status=parked&scope=bob", func() {
			require.Equal(t, atomicphase.KeyAbandoned, b.inspect(t, "bob", "parked-3").Status)
			require.Equal(t, atomicphase.KeyParked, b.inspect(t, "dave", "parked-4").Status, "another scope's key")
		}},
		{"resume", "status=parked&scope=dave", func() { require.Nil(t, b.inspect(t, "dave", "parked-4").ParkedAt) }},
		{"forget", "status=parked&scope=erin", func() { require.False(t, b.keyExists(t, "parked-6")) }},
	} {
		txt = act(t, ctx, base+"keys?list=1&"+c.filter, chromedp.Tasks{chromedp.SetValue("#bulk-action", c.action, chromedp.ByID)}, "#dry-run")
		require.Contains(t, txt, "This would "+c.action+" 1 key. Nothing has changed yet.", c.action)
		txt = act(t, ctx, "", nil, "#confirm-bulk")
		require.Contains(t, txt, c.action+": 1 done, 0 refused", c.action)
		c.check()
	}

	// Each action is in the key's audit trail, as who authenticated.
	trail, err := b.runner.AuditTrail(b.ctx, "frank", "unknown-1", 0)
	require.NoError(t, err)
	require.Len(t, trail, 1)
	require.Equal(t, "token", trail[0].Actor)
	var detail map[string]any
	require.NoError(t, json.Unmarshal(trail[0].Detail, &detail))
	require.Equal(t, "resolved", detail["done"])
	exit, stderr := stop()
	require.Equal(t, 0, exit, stderr)
	require.False(t, strings.Contains(stderr, "panic"))
}
