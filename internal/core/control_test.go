package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/internal/kit"
)

// A control call whose context ends while handlers still run names the
// partitions they run on, and only those.
func TestControlCallsNameThePartitionsStillInFlight(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, g *Group) error
	}{
		{"Pause", func(ctx context.Context, g *Group) error { return g.Pause(ctx) }},
		{"Leave", func(ctx context.Context, g *Group) error { return g.Leave(ctx, "b1") }},
		{"Seek", func(ctx context.Context, g *Group) error { return g.Seek(ctx, 1, 0) }},
		{"Replay", func(ctx context.Context, g *Group) error { return g.Replay(ctx, Start{}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, Config{})
				orders := mustTopic(t, b, "orders", TopicSpec{Partitions: 3})
				release := make(chan struct{})
				g := subscribe(t, b, "orders", "billing", "b1", func(ctx context.Context, d *Delivery) error {
					if d.Partition == 1 {
						<-release // busy on partition 1 only
					}
					return nil
				})
				for p := range 3 {
					publishTo(t, orders, p)
				}
				synctest.Wait() // partitions 0 and 2 done, 1 in its handler
				// Long enough for the idle workers to stop.
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				err := tc.call(ctx, g)
				wantErr(t, err, context.DeadlineExceeded)
				if msg := err.Error(); !strings.Contains(msg, "partitions 1 (offset 0)") || strings.Contains(msg, "partitions 1 (offset 0),") {
					t.Errorf("%s error %q, want it to name partition 1 alone", tc.name, msg)
				}
				close(release)
			})
		})
	}
}

// Drain's ErrStalled names each group that cannot move, says why, and
// mentions redriven dead letters only when some wait.
func TestDrainSaysWhyAGroupIsStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, Config{Retry: RetryPolicy{MaxAttempts: 1}})
		orders := mustTopic(t, b, "orders", TopicSpec{})
		g := subscribe(t, b, "orders", "billing", "b1", func(_ context.Context, d *Delivery) error {
			if string(d.Record.Value) == "poison" {
				return errors.New("boom")
			}
			return nil
		})
		publish(t, orders, "", "poison")
		drain(t, b) // dead-lettered
		mustPause(t, g)
		publish(t, orders, "", "ok")
		err := b.Drain(context.Background())
		wantErr(t, err, ErrStalled)
		if msg := err.Error(); !strings.Contains(msg, `group "billing" on topic "orders" lags 1 and is paused`) || strings.Contains(msg, "redriven") {
			t.Errorf("Drain: %q, want billing named as lagging 1 and paused, nothing redriven", msg)
		}
		if n, err := g.Redrive(context.Background(), nil); n != 1 || err != nil {
			t.Fatalf("Redrive: %d, %v", n, err)
		}
		err = b.Drain(context.Background())
		wantErr(t, err, ErrStalled)
		if msg := err.Error(); !strings.Contains(msg, "lags 1 with 1 redriven dead letters to deliver and is paused") {
			t.Errorf("Drain: %q, want the redriven letter named", msg)
		}
		if err := g.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// When Drain's context ends as the last record commits, Drain returns nil
// or an error that names what was left: never an error naming nothing.
func TestDrainsContextEndingAsTheLastRecordCommits(t *testing.T) {
	b := newBroker(t, Config{})
	orders := mustTopic(t, b, "orders", TopicSpec{})
	var mu sync.Mutex
	var cancelDrain context.CancelFunc
	subscribe(t, b, "orders", "billing", "b1", func(context.Context, *Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		cancelDrain() // the worker commits right after: a race with Drain's wake-up
		return nil
	})
	nils := 0
	for round := range 300 {
		ctx, cancel := context.WithCancel(context.Background())
		mu.Lock()
		cancelDrain = cancel
		mu.Unlock()
		publish(t, orders, "", fmt.Sprint(round))
		switch err := b.Drain(ctx); {
		case err == nil:
			nils++
		case !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), `left: group "billing" on topic "orders" lags`):
			t.Fatalf("round %d: Drain: %v; want nil or an error naming billing's lag", round, err)
		}
		drain(t, b)
	}
	t.Logf("%d of 300 drains saw the commit", nils)
}

// After Close's context ends it cancels the handlers' context and gives
// every group's handlers a short grace to return: a handler that honours
// its context is not reported as still running, whichever group it is in.
func TestCloseGivesEveryGroupsHandlersTheGrace(t *testing.T) {
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, Config{})
				orders := mustTopic(t, b, "orders", TopicSpec{})
				const groups = 8
				for i := range groups {
					// Each takes a little longer than the one before to
					// return once cancelled, all within the grace.
					unwind := time.Duration(i+1) * kit.CloseGrace / (groups + 1)
					subscribe(t, b, "orders", fmt.Sprintf("g%d", i), "c", func(ctx context.Context, _ *Delivery) error {
						<-ctx.Done()
						time.Sleep(unwind)
						return ctx.Err()
					})
				}
				publish(t, orders, "", "slow")
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				err := b.Close(ctx)
				se, ok := errors.AsType[*ShutdownError](err)
				if !ok || len(se.Unfinished) != groups {
					t.Fatalf("Close: %v, want a ShutdownError naming all %d groups", err, groups)
				}
				for _, u := range se.Unfinished {
					if u.Running {
						t.Errorf("%s reported running: its handler returned within the grace", u.Group)
					}
				}
			})
		})
	}
}
