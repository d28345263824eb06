package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/jetstream"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/nats-io/nats.go"
)

// These tests run several members of one group, each a broker on a
// connection of its own to one embedded server, as separate processes
// would be, and check what the group did with pubsubtest.History.
//
// They run on real time: the nats.go client cannot run in a synctest
// bubble. Every wait is a barrier (Drain, a channel) except where the
// server's own timers decide (a member's TTL, AckWait): there it polls the
// group's Assignment with a deadline.

const (
	membersTopic      = "orders"
	membersGroup      = "billing"
	membersPartitions = 6
	// settleTimeout bounds waiting for the group to settle after a join, a
	// leave or a crash: a few member TTLs and AckWaits, with room for a
	// loaded machine.
	settleTimeout = 20 * time.Second
)

// membersOptions make failure detection quick: a crashed member's
// partitions move about one TTL after its last heartbeat, and the record it
// was handling comes again after AckWait.
func membersOptions() []jetstream.Option {
	return []jetstream.Option{
		jetstream.WithMemberTTL(500 * time.Millisecond),
		jetstream.WithAckWait(time.Second),
		jetstream.WithPollWait(50 * time.Millisecond),
	}
}

// cluster is one embedded server and the members started on it.
type cluster struct {
	t    *testing.T
	srv  *jetstream.Server
	hist *pubsubtest.History
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	// TestMain checks for leaked goroutines once every test ended: the
	// server and every member are closed at cleanup.
	srv, err := jetstream.StartServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return &cluster{t: t, srv: srv, hist: pubsubtest.NewHistory()}
}

// member is one broker of the group.
type member struct {
	name  string
	nc    *nats.Conn
	b     *pubsub.Broker
	topic *pubsub.Topic[string, string]
	group *pubsub.Group[string] // nil for a publisher
}

// connect starts a broker named name on a connection of its own (TCP on
// loopback) with the topic opened; it is closed at the end of the test.
func (c *cluster) connect(name string) *member {
	c.t.Helper()
	nc, err := nats.Connect(c.srv.URL(), nats.Name(name), nats.NoReconnect())
	if err != nil {
		c.t.Fatal(err)
	}
	eng, err := jetstream.Connect(nc, membersOptions()...)
	if err != nil {
		nc.Close()
		c.t.Fatal(err)
	}
	b := pubsub.NewBroker(pubsub.WithEngine(eng))
	m := &member{name: name, nc: nc, b: b}
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil && !nc.IsClosed() {
			c.t.Errorf("closing %s: %v", name, err)
		}
		nc.Close()
	})
	if err := b.Err(); err != nil {
		c.t.Fatal(err)
	}
	m.topic, err = pubsub.NewTopic(b, membersTopic, codec.String(), codec.String(), pubsub.WithPartitions(membersPartitions))
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

// join starts a member that subscribes to the group with h, observed in
// the cluster's History.
func (c *cluster) join(name string, h pubsub.Handler[string], opts ...pubsub.SubscribeOption) *member {
	c.t.Helper()
	m := c.connect(name)
	g, err := m.topic.Subscribe(membersGroup, name, pubsubtest.Observe(c.hist, membersTopic, membersGroup, name, h), opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	m.group = g
	return m
}

// owned is what m's broker says m owns.
func (m *member) owned() []int {
	ps := slices.Clone(m.group.Assignment()[m.name])
	slices.Sort(ps)
	return ps
}

// waitBalanced polls until the members own every partition between them,
// each exactly once, as evenly as possible (counts differ by at most one),
// and fails the test after settleTimeout. Polling is the only way here:
// when a crashed member's partitions move is decided by the server's TTLs.
func (c *cluster) waitBalanced(members ...*member) {
	c.t.Helper()
	deadline := time.Now().Add(settleTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		owners := map[int]int{}
		lo, hi := membersPartitions, 0
		for _, m := range members {
			ps := m.owned()
			lo, hi = min(lo, len(ps)), max(hi, len(ps))
			for _, p := range ps {
				owners[p]++
			}
		}
		exclusive := len(owners) == membersPartitions
		for _, n := range owners {
			exclusive = exclusive && n == 1
		}
		if exclusive && hi-lo <= 1 {
			return
		}
		if time.Now().After(deadline) {
			var got []string
			for _, m := range members {
				got = append(got, fmt.Sprintf("%s=%v", m.name, m.owned()))
			}
			c.t.Fatalf("not balanced after %v: %v", settleTimeout, got)
		}
		<-tick.C
	}
}

// publish publishes n records from m, keyed over 24 customers, and logs
// them in the History; values say which record they are.
func (c *cluster) publish(m *member, from, n int) {
	c.t.Helper()
	for i := from; i < from+n; i++ {
		pos, err := m.topic.Publish(context.Background(), fmt.Sprintf("customer-%02d", i%24), fmt.Sprintf("order-%04d", i))
		if err != nil {
			c.t.Errorf("publish %d: %v", i, err)
			return
		}
		c.hist.Published(membersTopic, pos)
	}
}

// drain waits, on m's broker, until the group has committed everything.
func drain(t *testing.T, m *member) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.b.Drain(ctx); err != nil {
		t.Fatalf("drain on %s: %v", m.name, err)
	}
}

// check fails the test with the History's violations.
func (c *cluster) check() pubsubtest.Report {
	c.t.Helper()
	rep := c.hist.Check()
	if err := rep.Err(); err != nil {
		for _, e := range c.hist.Events() {
			c.t.Log(e)
		}
		c.t.Fatal(err)
	}
	return rep
}

// deliveriesBy counts the History's deliveries per consumer.
func (c *cluster) deliveriesBy() map[string]int {
	n := map[string]int{}
	for _, e := range c.hist.Events() {
		if e.Kind == pubsubtest.Start {
			n[e.Consumer]++
		}
	}
	return n
}

// work is a handler that takes a little time, as real work does, so that
// joins and leaves find deliveries in flight.
var work = pubsub.HandlerFunc[string](func(ctx context.Context, _ pubsub.Message[string]) error {
	t := time.NewTimer(200 * time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
})

// Two members, then three, then two again, while records flow: ownership
// is exclusive and balanced after each change, and a clean join or leave
// redelivers nothing.
func TestMembersJoinAndLeaveCleanly(t *testing.T) {
	c := newCluster(t)
	pub := c.connect("publisher")
	a := c.join("a", work)
	c.waitBalanced(a)

	const batch = 300
	flow := func(round int) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.publish(pub, round*batch, batch)
		}()
		return done
	}

	published := flow(0)
	b := c.join("b", work)
	c.waitBalanced(a, b)
	<-published

	published = flow(1)
	m3 := c.join("c", work)
	c.waitBalanced(a, b, m3)
	<-published

	published = flow(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.group.Leave(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	c.waitBalanced(a, m3)
	<-published

	c.publish(pub, 3*batch, batch)
	drain(t, a)
	rep := c.check()
	if rep.Published != 4*batch {
		t.Errorf("published %d, want %d", rep.Published, 4*batch)
	}
	if n := rep.Redelivered(); n != 0 {
		t.Errorf("%d redeliveries (%v); a clean join or leave redelivers nothing", n, rep.Redeliveries)
	}
	by := c.deliveriesBy()
	t.Logf("%d deliveries of %d records, by member %v; redeliveries %v", rep.Deliveries, rep.Published, by, rep.Redeliveries)
	for _, name := range []string{"a", "b", "c"} {
		if by[name] == 0 {
			t.Errorf("deliveries by member %v: %s handled nothing", by, name)
		}
	}
}

// A member whose connection dies while its handler runs: the others take
// over its partitions, nothing is lost, and the record it was handling
// comes again with a higher attempt.
func TestMemberKilledMidHandler(t *testing.T) {
	for _, members := range []int{2, 3} {
		t.Run(fmt.Sprintf("members=%d", members), func(t *testing.T) {
			c := newCluster(t)
			pub := c.connect("publisher")

			// The victim's handler blocks on its 20th delivery until the
			// test has cut its connection.
			var calls atomic.Int64
			stuck, release := make(chan pubsub.Message[string], 1), make(chan struct{})
			victimHandler := pubsub.HandlerFunc[string](func(ctx context.Context, msg pubsub.Message[string]) error {
				if calls.Add(1) == 20 {
					stuck <- msg
					<-release
				}
				return work(ctx, msg)
			})
			var releaseOnce sync.Once
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

			victim := c.join("victim", victimHandler)
			survivors := []*member{}
			for i := range members - 1 {
				survivors = append(survivors, c.join(fmt.Sprintf("s%d", i+1), work))
			}
			c.waitBalanced(append([]*member{victim}, survivors...)...)

			// Records flow while the victim dies, so that its other
			// partitions have deliveries in flight too.
			const n = 600
			published := make(chan struct{})
			go func() {
				defer close(published)
				c.publish(pub, 0, n)
			}()
			var inFlight pubsub.Message[string]
			select {
			case inFlight = <-stuck:
			case <-time.After(settleTimeout):
				t.Fatal("the victim never reached its 20th delivery")
			}
			victim.nc.Close() // the process dies: no ack, no heartbeat
			c.hist.Crashed("victim")
			releaseOnce.Do(func() { close(release) })
			<-published

			c.waitBalanced(survivors...)
			drain(t, survivors[0])
			rep := c.check()
			if rep.Published != n {
				t.Errorf("published %d, want %d", rep.Published, n)
			}
			t.Logf("%d deliveries of %d records, by member %v; redeliveries %v; in flight at the crash: %d@%d",
				rep.Deliveries, rep.Published, c.deliveriesBy(), rep.Redeliveries, inFlight.Partition, inFlight.Offset)
			if rep.Redeliveries["attempt"] == 0 {
				t.Errorf("redeliveries %v: the record in flight at the crash did not come again", rep.Redeliveries)
			}
			// The record in flight came again, to a survivor, one attempt on.
			again := false
			for _, e := range c.hist.Events() {
				if e.Kind == pubsubtest.Start && e.Partition == inFlight.Partition && e.Offset == inFlight.Offset &&
					e.Consumer != "victim" && e.Attempt == inFlight.Attempt+1 {
					again = true
				}
			}
			if !again {
				t.Errorf("%d@%d (attempt %d), in flight at the crash, was not delivered to a survivor with attempt %d",
					inFlight.Partition, inFlight.Offset, inFlight.Attempt, inFlight.Attempt+1)
			}
		})
	}
}

// A member whose connection dies while a record it failed waits for its
// retry: a survivor gets the record, and its Attempt goes on from the
// server's count (2), not from 1: attempts survive failover.
func TestAttemptsSurviveFailover(t *testing.T) {
	c := newCluster(t)
	pub := c.connect("publisher")
	retry := pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: time.Second, Multiplier: 1})

	// The victim fails the first record it is given, once, and tells the
	// test, which then cuts its connection while the retry waits.
	failed := make(chan pubsub.Message[string], 1)
	var first sync.Once
	victimHandler := pubsub.HandlerFunc[string](func(ctx context.Context, msg pubsub.Message[string]) error {
		var err error
		first.Do(func() {
			failed <- msg
			err = errors.New("warehouse busy")
		})
		if err != nil {
			return err
		}
		return work(ctx, msg)
	})
	victim := c.join("victim", victimHandler, retry)
	survivor := c.join("survivor", work, retry)
	c.waitBalanced(victim, survivor)

	// The kill must come within the retry's backoff (1s): the publishes
	// go on in the background meanwhile.
	const n = 200
	published := make(chan struct{})
	go func() {
		defer close(published)
		c.publish(pub, 0, n)
	}()
	var x pubsub.Message[string]
	select {
	case x = <-failed:
	case <-time.After(settleTimeout):
		t.Fatal("the victim was given nothing")
	}
	victim.nc.Close()
	c.hist.Crashed("victim")
	<-published

	c.waitBalanced(survivor)
	drain(t, survivor)
	rep := c.check()
	if rep.Published != n {
		t.Errorf("published %d, want %d", rep.Published, n)
	}
	var attempts []int
	for _, e := range c.hist.Events() {
		if e.Kind == pubsubtest.Start && e.Consumer == "survivor" && e.Partition == x.Partition && e.Offset == x.Offset {
			attempts = append(attempts, e.Attempt)
		}
	}
	t.Logf("%d@%d failed by the victim at attempt %d; the survivor's attempts: %v; redeliveries %v",
		x.Partition, x.Offset, x.Attempt, attempts, rep.Redeliveries)
	if len(attempts) == 0 || attempts[0] != x.Attempt+1 {
		t.Errorf("the survivor's attempts at %d@%d: %v, want the first to be %d", x.Partition, x.Offset, attempts, x.Attempt+1)
	}
}
