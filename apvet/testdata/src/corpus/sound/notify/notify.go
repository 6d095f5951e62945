// Package notify sends a webhook and an SMS through clients whose
// Transport is call.Transport, one built by a helper that is handed call:
// apvet reports nothing in it.
package notify

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/atomicphase/atomicphase"
)

type Order struct {
	ID      int64
	Hook    string
	Phone   string
	HookAck string
	SMSID   string
}

// guardedClient is the one place the services' clients are built: the
// transport below it is the test's (which can break connections) or the
// default.
func guardedClient(call *atomicphase.ForeignCall, base http.RoundTripper) *http.Client {
	return &http.Client{Transport: call.Transport(base), Timeout: 10 * time.Second}
}

type Notifier struct {
	transport http.RoundTripper
	smsAt     string
}

func (n *Notifier) Phases() []atomicphase.Phase[Order] {
	return []atomicphase.Phase[Order]{
		atomicphase.Foreign("webhook", n.webhook, nil),
		atomicphase.Foreign("sms", func(ctx context.Context, call *atomicphase.ForeignCall, o *Order) error {
			client := &http.Client{Transport: call.Transport(n.transport)}
			form := url.Values{"to": {o.Phone}, "body": {fmt.Sprintf("order %d shipped", o.ID)}}
			resp, err := client.PostForm(n.smsAt+"/messages", form)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			o.SMSID = resp.Header.Get("Message-Id")
			return nil
		}, func(ctx context.Context, tx atomicphase.Tx, o *Order) (atomicphase.Outcome, error) {
			tx.Queue(`UPDATE orders SET sms_id = $2 WHERE id = $1`, o.ID, o.SMSID)
			return atomicphase.Continue(), nil
		}),
	}
}

// webhook posts through the client guardedClient builds from call: the
// request is guarded, and carries the key, wherever it is sent.
func (n *Notifier) webhook(ctx context.Context, call *atomicphase.ForeignCall, o *Order) error {
	client := guardedClient(call, n.transport)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.Hook, strings.NewReader(fmt.Sprintf(`{"order": %d}`, o.ID)))
	if err != nil {
		return atomicphase.Permanent(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		return fmt.Errorf("webhook: %s", resp.Status)
	}
	o.HookAck = resp.Status
	return nil
}
