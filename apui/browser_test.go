package apui

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/atomicphase/atomicphase"
)

// The console in a real browser: headless Chromium, driven over the
// DevTools protocol. The test skips when no Chromium is installed, and fails
// instead in CI (CI=true), which installs it (scripts/ensure-chromium). With
// ATOMICPHASE_SCREENSHOTS set to a directory, it saves a screenshot of every
// page it visits there (make screenshots writes docs/console/).

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

// browser starts a headless Chromium for the test, with extra flags, and
// returns its context.
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	opts := append([]chromedp.ExecAllocatorOption{},
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 860),
	)
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	// A bound on the whole browser session, so that a hung browser fails
	// the test instead of the suite's timeout; nothing is timed.
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Run(ctx), "start Chromium")
	return ctx
}

// shoot saves a screenshot of the page as name.png when asked to.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("ATOMICPHASE_SCREENSHOTS")
	if dir == "" {
		return
	}
	var png []byte
	require.NoError(t, chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// pageText is the visible text of the page's main element.
func pageText(t *testing.T, ctx context.Context) string {
	t.Helper()
	var s string
	require.NoError(t, chromedp.Run(ctx, chromedp.Text("main", &s, chromedp.ByQuery)))
	return s
}

func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, &Options{Actor: func(*http.Request) string { return "operator" }})
	ctx := browser(t)
	u := b.srv.URL
	// The hour a console that sampled the levels would have seen: parks
	// piling up, then an unknown outcome.
	now := time.Now()
	for i := range 12 {
		b.handler.samples.add(levelSample{At: now.Add(time.Duration(i-12) * 5 * time.Minute),
			Unfinished: int64(1 + i/2), Parked: int64(i / 3), Unknown: int64(i / 10)})
	}

	// The overview: the levels by workflow and status, and the last hour.
	require.NoError(t, chromedp.Run(ctx, chromedp.Navigate(u+"/"), chromedp.WaitVisible("#levels", chromedp.ByID),
		chromedp.WaitVisible("#levels-chart", chromedp.ByID)))
	txt := pageText(t, ctx)
	require.Contains(t, txt, "6\nunfinished keys")
	require.Contains(t, txt, "4\nparked")
	require.Contains(t, txt, "unknown-1")
	require.Contains(t, txt, "unfinished 6")
	var lines int
	require.NoError(t, chromedp.Run(ctx, chromedp.Evaluate(`document.querySelectorAll('#levels-chart polyline').length`, &lines)))
	require.Equal(t, 3, lines, "the chart draws its three lines")
	// Each count stands under its own status: every header is aligned as
	// the numbers below it, as the browser lays them out.
	var misaligned []string
	require.NoError(t, chromedp.Run(ctx, chromedp.Evaluate(`(() => {
		const heads = [...document.querySelectorAll('#levels thead th')];
		const cells = [...document.querySelectorAll('#levels tbody tr:first-child td')];
		return heads.flatMap((th, i) => getComputedStyle(th).textAlign === getComputedStyle(cells[i]).textAlign ? [] : [th.textContent]);
	})()`, &misaligned)))
	require.Empty(t, misaligned, "columns whose header is aligned otherwise than their numbers")
	shoot(t, ctx, "overview")

	// A filtered list: bob's parked keys.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(u+"/keys"), chromedp.WaitVisible("#filter", chromedp.ByID),
		chromedp.SetValue(`select[name="status"]`, "parked", chromedp.ByQuery),
		chromedp.SendKeys(`#filter input[name="scope"]`, "bob", chromedp.ByQuery),
		chromedp.Click("#apply", chromedp.ByID),
		chromedp.WaitVisible("#dry-run", chromedp.ByID)))
	txt = pageText(t, ctx)
	for _, k := range []string{"parked-1", "parked-2", "parked-3"} {
		require.Contains(t, txt, k)
	}
	require.NotContains(t, txt, "parked-4", "dave's key is filtered out")
	require.NotContains(t, txt, "finished-1")
	shoot(t, ctx, "keys")

	// A bulk unpark: the dry run shows the count and a sample, and changes
	// nothing; the confirmation unparks exactly those keys.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.SetValue("#bulk-action", "unpark", chromedp.ByID),
		chromedp.Click("#dry-run", chromedp.ByID),
		chromedp.WaitVisible("#dry-run-count", chromedp.ByID)))
	require.Contains(t, pageText(t, ctx), "This would unpark 3 keys. Nothing has changed yet.")
	for _, k := range []string{"parked-1", "parked-2", "parked-3"} {
		require.Equal(t, atomicphase.KeyParked, b.inspect(t, "bob", k).Status, "the dry run changed nothing")
	}
	shoot(t, ctx, "bulk-dry-run")
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Click("#confirm-bulk", chromedp.ByID),
		chromedp.WaitVisible("#bulk-done", chromedp.ByID)))
	require.Contains(t, pageText(t, ctx), "unpark: 3 done, 0 refused")
	for _, k := range []string{"parked-1", "parked-2", "parked-3"} {
		require.Equal(t, atomicphase.KeyAbandoned, b.inspect(t, "bob", k).Status)
	}
	require.Equal(t, atomicphase.KeyParked, b.inspect(t, "dave", "parked-4").Status)
	shoot(t, ctx, "bulk-done")

	// The versions: each workflow's, with its phases and drain state.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Click("#nav-versions", chromedp.ByID), chromedp.WaitVisible("#versions", chromedp.ByID)))
	txt = pageText(t, ctx)
	require.Contains(t, txt, "buy_label → confirm")
	require.Contains(t, txt, "not drained")
	shoot(t, ctx, "versions")

	// A key's page: an escaped hostile error, shown, not obeyed.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/key?scope=erin&key=hostile-1"), chromedp.WaitVisible("#last-error", chromedp.ByID)))
	var lastError string
	require.NoError(t, chromedp.Run(ctx, chromedp.Text("#last-error", &lastError, chromedp.ByID)))
	require.Contains(t, lastError, `name \x1b]8;;http://evil.example/\x07click me`)
	require.Contains(t, lastError, "\nsecond line")
	require.NotContains(t, lastError, "\x1b")

	// A resolve: the operator's verdict on the unknown outcome, with a note;
	// then resume runs the rest without buying the label again.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(u+"/key?scope=frank&key=unknown-1"), chromedp.WaitVisible("#resolve", chromedp.ByID)))
	var downstream string
	require.NoError(t, chromedp.Run(ctx, chromedp.Text("#downstream", &downstream, chromedp.ByID)))
	require.Contains(t, downstream, "buy_label\t"+b.labelRef, "the reference the label service was sent")
	shoot(t, ctx, "key")
	require.NoError(t, chromedp.Run(ctx,
		chromedp.SetValue("#happened", "true", chromedp.ByID),
		chromedp.SendKeys("#note", "label service support confirmed lbl-1", chromedp.ByID),
		chromedp.SendKeys("#result", `"lbl-1"`, chromedp.ByID),
		chromedp.Click("#resolve-button", chromedp.ByID),
		chromedp.WaitVisible("#notice", chromedp.ByID)))
	txt = pageText(t, ctx)
	require.Contains(t, txt, "Verdict recorded")
	require.Contains(t, txt, "happened — operator: label service support confirmed lbl-1")
	shoot(t, ctx, "resolve")
	k := b.inspect(t, "frank", "unknown-1")
	require.True(t, *k.ResolvedHappened)
	require.JSONEq(t, `"lbl-1"`, string(k.ResolvedResult))

	calls := *b.labels
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Click("#resume", chromedp.ByID),
		chromedp.WaitVisible("#response-status", chromedp.ByID)))
	require.Contains(t, pageText(t, ctx), "Resumed")
	require.Equal(t, calls, *b.labels, "the label the operator confirmed was not bought again")
	k = b.inspect(t, "frank", "unknown-1")
	require.Equal(t, atomicphase.KeyFinished, k.Status)
	require.JSONEq(t, `{"item":"unknown-1","label":"lbl-1"}`, string(k.Response.Body), "the confirmation carries the label the operator recorded")
	shoot(t, ctx, "resumed")
	require.False(t, strings.Contains(txt, "\x1b"))
}
