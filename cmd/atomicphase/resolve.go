package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atomicphase/atomicphase"
)

func (c *cli) resolveCmd() *cobra.Command {
	var happened, notHappened, yes bool
	var note, result string
	cmd := &cobra.Command{
		Use:   "resolve SCOPE KEY (--happened [--result JSON] | --not-happened) --note TEXT",
		Short: "Settle by hand whether a key's call with an unknown outcome took effect",
		Long: strings.TrimSpace(`
Record an operator's verdict on a foreign call whose outcome is unknown (a
payout whose answer was lost, say), when neither the reconcile function nor
a webhook can tell: you checked with the downstream yourself. The verdict,
the note and the time are kept in the key's row (inspect shows them), and
the key is made due at once with a fresh budget of attempts (as unpark
gives). A key that waits on no unknown outcome (its phase has no reconcile
function) is refused: unpark it instead.

The next attempt that resumes into the waiting phase (the sweep of a
process that registered the key's workflow, or a client retry) follows the
verdict, once: --not-happened makes the call; --happened goes on as if the
call had succeeded (the reconcile function is still asked for the call's
result, and only its "cannot tell" is overruled).

With --happened, --result gives the call's result as you read it from the
downstream, as JSON (a quoted string, an object): a phase whose reconcile
function reads ForeignCall.OperatorResult records it in the state, as its
call would have; without it, the state stays as it is (a label id the next
phases need stays empty).`),
		Example: examples(`atomicphase resolve driver_7 ride-5521 --not-happened --note "no such payout in the bank's portal (ops: ana)"`,
			`atomicphase resolve shop_3 order-88 --happened --result '{"label_id":"lbl_9x2"}' --note "label found in the carrier's portal (ops: ana)"`),
		Args: keyArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if happened == notHappened {
				return usageErrorf("give exactly one of --happened and --not-happened")
			}
			if strings.TrimSpace(note) == "" {
				return usageErrorf("--note is required: say who checked, and how")
			}
			if cmd.Flags().Changed("result") && !happened {
				return usageErrorf("--result goes with --happened: a call that did not happen has no result")
			}
			if cmd.Flags().Changed("result") && !json.Valid([]byte(result)) {
				return usageErrorf("--result %q is not JSON; quote a string ('\"lbl_9x2\"') or give an object", result)
			}
			scope, key := args[0], args[1]
			return c.withRunner(cmd.Context(), func(r *atomicphase.Runner) error {
				if !yes {
					// Refusals first: no question for a key that cannot take
					// a verdict.
					info, err := r.Inspect(cmd.Context(), scope, key)
					switch {
					case errors.Is(err, atomicphase.ErrKeyNotFound):
						return keyNotFound(scope, key)
					case err != nil:
						return err
					case info.Response != nil:
						return fmt.Errorf("key %q in scope %q is finished: there is nothing left to resolve", key, scope)
					case info.UnknownAt == nil:
						return noUnknownOutcome(scope, key)
					}
					verdict := "did not take effect: the call will be made"
					if happened {
						verdict = "took effect: it will not be made again"
					}
					fmt.Fprintf(c.stderr, "Record that the call key %q in scope %q waits on %s? [y/N] ", key, scope, verdict)
					answer, _ := bufio.NewReader(c.stdin).ReadString('\n')
					if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
						return errors.New("not confirmed: nothing recorded (answer y, or pass --yes)")
					}
				}
				var err error
				if cmd.Flags().Changed("result") {
					err = r.RecordResolutionWithResult(cmd.Context(), scope, key, note, []byte(result))
				} else {
					err = r.RecordResolution(cmd.Context(), scope, key, happened, note)
				}
				switch {
				case errors.Is(err, atomicphase.ErrKeyNotFound):
					return keyNotFound(scope, key)
				case errors.Is(err, atomicphase.ErrKeyFinished):
					return fmt.Errorf("key %q in scope %q is finished: there is nothing left to resolve", key, scope)
				case errors.Is(err, atomicphase.ErrNoUnknownOutcome):
					return noUnknownOutcome(scope, key)
				case errors.Is(err, atomicphase.ErrInProgress):
					return fmt.Errorf("key %q in scope %q is held by an attempt right now; try again once it ends", key, scope)
				case err != nil:
					return err
				}
				detail := map[string]any{"happened": happened}
				if cmd.Flags().Changed("result") {
					detail["result"] = json.RawMessage(result)
				}
				if err := c.audit(cmd.Context(), r, scope, key, "resolve", note, detail); err != nil {
					return err
				}
				verdict := "did not happen: the call will be made"
				if happened {
					verdict = "happened: the request goes on without making the call again"
				}
				if after, ierr := r.Inspect(cmd.Context(), scope, key); ierr == nil && after.Status == atomicphase.KeyParked {
					// Parked for good: a bug, which the verdict does not fix.
					_, err = fmt.Fprintf(c.stdout, "verdict recorded (%s); the key stays parked, as it was parked for good (a permanent failure or a panic: see its last error): "+
						"unpark it once its code is fixed, and the attempt that resumes it follows the verdict\n", verdict)
					return err
				}
				_, err = fmt.Fprintf(c.stdout, "verdict recorded (%s); the next sweep of a process that registered the key's workflow, or a client retry, follows it\n", verdict)
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&happened, "happened", false, "the call took effect")
	cmd.Flags().BoolVar(&notHappened, "not-happened", false, "the call did not take effect")
	cmd.Flags().StringVar(&note, "note", "", "who checked, and how (kept in the key's row)")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().StringVar(&result, "result", "", "with --happened: the call's result as JSON, for the phase's reconcile function (ForeignCall.OperatorResult)")
	return cmd
}

// noUnknownOutcome is resolve's refusal of a key that waits on no call of
// unknown outcome.
func noUnknownOutcome(scope, key string) error {
	return fmt.Errorf("key %q in scope %q waits on no call of unknown outcome (its phase has no reconcile function, or the call is known not to have been made), so there is no verdict to record: run \"atomicphase unpark %s %s\" to retry it, or \"atomicphase forget\" to drop it", key, scope, scope, key)
}
