package jetstream

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
	"github.com/logbus/logbus/pubsub"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// capturing is an engine opener that keeps the engine it opened, for the
// tests that reach into it.
type capturing struct {
	pubsub.Engine
	got *eng
}

func (c *capturing) Open(cfg engine.Config) (engine.Engine, error) {
	e, err := c.Engine.Open(cfg)
	if err == nil {
		c.got = e.(*eng)
	}
	return e, err
}

// rebalances counts a broker's rebalance events.
type rebalances struct{ n atomic.Int64 }

func (r *rebalances) OnRebalance(pubsub.RebalanceEvent) { r.n.Add(1) }

// membershipEvents counts a broker's membership events: failures and
// recoveries.
type membershipEvents struct{ failed, restored atomic.Int64 }

func (m *membershipEvents) OnMembership(e pubsub.MembershipEvent) {
	if e.Err != nil {
		m.failed.Add(1)
	} else {
		m.restored.Add(1)
	}
}

// waitOwners polls until every group reports the assignment want, or
// fails the test after 20s: when a membership change lands is up to the
// server's TTLs, so there is nothing to wait on but the assignment.
func waitOwners(t *testing.T, want map[string][]int, groups ...*pubsub.Group[string]) {
	t.Helper()
	owned := poll(20*time.Second, func() bool {
		ok := true
		for _, g := range groups {
			got := g.Assignment()
			for _, ps := range got {
				slices.Sort(ps)
			}
			if len(got) != len(want) {
				ok = false
			}
			for m, ps := range want {
				ok = ok && slices.Equal(got[m], ps)
			}
		}
		return ok
	})
	if !owned {
		t.Fatalf("assignments %v after 20s, want %v", assignments(groups), want)
	}
}

// assignments are the groups' assignments, as they read now.
func assignments(groups []*pubsub.Group[string]) []string {
	var got []string
	for _, g := range groups {
		got = append(got, fmt.Sprint(g.Assignment()))
	}
	return got
}

// waitSpread polls until every group reports the members sharing the
// partitions evenly between them (each owns parts/len(members)), or fails
// the test after 20s.
func waitSpread(t *testing.T, parts int, members []string, groups ...*pubsub.Group[string]) {
	t.Helper()
	spread := poll(20*time.Second, func() bool {
		ok := true
		for _, g := range groups {
			got := g.Assignment()
			seen := map[int]bool{}
			ok = ok && len(got) == len(members)
			for _, m := range members {
				ok = ok && len(got[m]) == parts/len(members)
				for _, p := range got[m] {
					ok = ok && !seen[p]
					seen[p] = true
				}
			}
		}
		return ok
	})
	if !spread {
		t.Fatalf("assignments %v after 20s, want %v sharing %d partitions evenly", assignments(groups), members, parts)
	}
}

func ignore(context.Context, pubsub.Message[string]) error { return nil }

// twoMembers subscribes member "a" of group "billing" on broker a and
// member "b" on b, to topic "orders" of four partitions, and waits until
// they share the partitions, a owning 0 and 1.
func twoMembers(t *testing.T, a, b *pubsub.Broker) (ga, gb *pubsub.Group[string]) {
	t.Helper()
	ga, gb = joinOrders(t, a, "a"), joinOrders(t, b, "b")
	waitOwners(t, map[string][]int{"a": {0, 1}, "b": {2, 3}}, ga, gb)
	return ga, gb
}

// joinOrders subscribes member to group "billing" of topic "orders" (four
// partitions) on b, with a handler that acks.
func joinOrders(t *testing.T, b *pubsub.Broker, member string) *pubsub.Group[string] {
	t.Helper()
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	g, err := topic.Subscribe("billing", member, pubsub.HandlerFunc[string](ignore))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A broker whose group loop is stuck (here: its reconcile held; in the
// field, a request to a server in trouble taking the 5s request timeout,
// as long as the member TTL) keeps its members alive: heartbeats do not
// wait for the loop, so no other broker sees them expire and takes their
// partitions. Before heartbeats had their own goroutine, this member's key
// expired after one TTL and the other broker took its partitions.
func TestHeartbeatsDoNotWaitForTheLoop(t *testing.T) {
	opts := testOptions() // MemberTTL 1s
	ca := &capturing{Engine: testServer.Engine(opts...)}
	rb := &rebalances{}
	a, b := brokerOn(t, ca), brokerOn(t, testServer.Engine(opts...), pubsub.WithHooks(rb))
	ga, gb := twoMembers(t, a, b)

	g := ca.got.groups[groupKey{"orders", "billing"}]
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	beats, err := g.e.kv.Watch(ctx, g.e.names.memberKey("orders", "billing", "a"), natsjs.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = beats.Stop() }()
	before := rb.n.Load()
	g.members.recMu.Lock()
	// The scenario: three member TTLs pass while a's loop is stuck, told
	// by a's own heartbeats (three to a TTL): ten of them span nine
	// intervals.
	for n := 0; n < 10; {
		select {
		case e := <-beats.Updates():
			if e != nil {
				n++
			}
		case <-ctx.Done():
			g.members.recMu.Unlock()
			t.Fatalf("a's member key was refreshed %d times while its loop was stuck, want 10: its heartbeats wait for the loop", n)
		}
	}
	g.members.recMu.Unlock()
	if n := rb.n.Load() - before; n != 0 {
		t.Errorf("b saw %d rebalances while a's loop was stuck, want none: a's heartbeats stopped with its loop", n)
	}
	waitOwners(t, map[string][]int{"a": {0, 1}, "b": {2, 3}}, ga, gb)
}

// syncBuffer is a log destination for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// When the server loses the membership and assignment buckets (memory
// storage across a restart of the server, as older versions made them,
// or a deletion), the brokers make them again, their members come back,
// the watches follow the new buckets, and a member that crashes
// afterwards is replaced within the detection time. The failure and the
// recovery are logged and raised to HookMembership, and the failure shows
// in the Snapshot meanwhile.
func TestMembershipSurvivesLostBuckets(t *testing.T) {
	opts := testOptions() // MemberTTL 1s
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ca := &capturing{Engine: testServer.Engine(opts...)}
	hook := &membershipEvents{}
	a := brokerOn(t, ca, pubsub.WithLogger(logger), pubsub.WithHooks(hook))
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	eb, err := Connect(nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b := brokerOn(t, eb)
	ga, _ := twoMembers(t, a, b)

	// The server loses both buckets.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := ca.got
	for _, bucket := range []string{e.names.bucket(), e.names.bucket() + "_deals"} {
		if err := e.js.DeleteKeyValue(ctx, bucket); err != nil {
			t.Fatal(err)
		}
	}
	// Both come back, with both members in them.
	var sawErr, lerr, derr error
	var got []string
	repaired := poll(20*time.Second, func() bool {
		snap := a.Snapshot()
		if g := snap.Topics[0].Groups[0]; g.MembershipErr != nil {
			sawErr = g.MembershipErr
			if g.MembershipErrSince.IsZero() {
				t.Errorf("snapshot: MembershipErr %v with a zero MembershipErrSince", g.MembershipErr)
			}
		}
		keys, err := e.kv.ListKeys(ctx)
		lerr, got = err, nil
		if err == nil {
			for k := range keys.Keys() {
				got = append(got, k)
			}
		}
		_, derr = e.deals.Get(ctx, e.names.memberPrefix("orders", "billing")+"deal")
		return len(got) == 2 && derr == nil
	})
	if !repaired { // polled: the brokers' repair runs on their ticks
		t.Fatalf("after 20s the membership bucket holds %v (%v), the deal: %v", got, lerr, derr)
	}
	t.Logf("the snapshot showed %v", sawErr)
	if out := logs.String(); !strings.Contains(out, "cannot follow the group's membership") ||
		!strings.Contains(out, "group membership restored") {
		t.Errorf("the log does not tell of the failure and the recovery:\n%s", out)
	}
	if f, r := hook.failed.Load(), hook.restored.Load(); f == 0 || r != f {
		t.Errorf("HookMembership saw %d failures and %d recoveries, want as many of each, at least one", f, r)
	}
	if g := a.Snapshot().Topics[0].Groups[0]; g.MembershipErr != nil {
		t.Errorf("MembershipErr %v after the recovery, want nil", g.MembershipErr)
	}

	// b's process dies: a takes its partitions within the detection time
	// (about 4/3 MemberTTL after b's last heartbeat), so a's watches and
	// reconciles work on the new buckets.
	nc.Close()
	crashed := time.Now()
	waitOwners(t, map[string][]int{"a": {0, 1, 2, 3}}, ga)
	took := time.Since(crashed)
	t.Logf("b's partitions taken over %v after its connection closed (MemberTTL 1s)", took)
	if took > 3*time.Second {
		t.Errorf("takeover took %v, want about 4/3 MemberTTL (1s), at most 3s", took)
	}
}
