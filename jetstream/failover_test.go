package jetstream

import (
	"context"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// The failover tests run on servers in child processes (cluster_test.go),
// killed with SIGKILL. They are slow (a Raft election after a server dies
// takes 4-9s), so they run only with LOGBUS_CLUSTER=1, as every
// TestCluster... test does:
//
//	LOGBUS_CLUSTER=1 go test -race -count=1 -run '^TestCluster' -v ./jetstream/

// deliveries times every handler call of a group, to tell when a record
// came again relative to a crash.
type deliveries struct {
	mu   sync.Mutex
	list []delivery
}

type delivery struct {
	consumer          string
	partition         int
	offset            int64
	attempt           int
	value             string
	started, returned time.Time
}

// handler returns a handler that logs each call, taking 1ms of work.
func (d *deliveries) handler(consumer string) pubsub.Handler[string] {
	return pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
		x := delivery{consumer: consumer, partition: m.Partition, offset: m.Offset, attempt: m.Attempt, value: m.Value,
			started: time.Now()}
		t := time.NewTimer(time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		x.returned = time.Now()
		d.mu.Lock()
		d.list = append(d.list, x)
		d.mu.Unlock()
		return nil
	})
}

func (d *deliveries) all() []delivery {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.list)
}

// crashWindow returns the deliveries that repeat an earlier one of the
// same record with no higher Attempt and by the same consumer: what the
// server's lost consumer state brings again (an owner change or a higher
// Attempt explain the others); with, for each, how long before crash its
// earlier delivery returned.
func crashWindow(ds []delivery, crash time.Time) (repeats []delivery, ages []time.Duration) {
	last := map[[2]int64]delivery{}
	for _, d := range ds {
		k := [2]int64{int64(d.partition), d.offset}
		if prev, ok := last[k]; ok && d.attempt <= prev.attempt && d.consumer == prev.consumer {
			repeats = append(repeats, d)
			ages = append(ages, crash.Sub(prev.returned))
		}
		last[k] = d
	}
	return repeats, ages
}

// producer publishes to every partition of a topic, a goroutine per
// partition, one record at a time, until halted; it keeps what the server
// acknowledged and when. A publish gets a second: one that fails (its
// partition has no leader) is given up and the next one tried, so a
// partition's first acknowledgement after a crash says when it took
// publishes again, to within that second.
type producer struct {
	mu      sync.Mutex
	acked   map[pubsub.Position]string
	ackedAt map[pubsub.Position]time.Time
	failed  int
	lastErr error
	more    chan struct{} // closed and replaced on every acknowledgement

	stop chan struct{}
	wg   sync.WaitGroup
}

// keysOf returns n keys of the String codec that the default partitioner
// (CRC-32 of the encoded key) sends to partition p of parts.
func keysOf(p, parts, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint("k", i)
		if int(crc32.ChecksumIEEE([]byte(k))%uint32(parts)) == p {
			keys = append(keys, k)
		}
	}
	return keys
}

func startProducer(topic *pubsub.Topic[string, string], parts int) *producer {
	pr := &producer{acked: map[pubsub.Position]string{}, ackedAt: map[pubsub.Position]time.Time{},
		more: make(chan struct{}), stop: make(chan struct{})}
	for p := range parts {
		keys := keysOf(p, parts, 8)
		pr.wg.Go(func() { // exits when halted
			for i := 0; ; i++ {
				select {
				case <-pr.stop:
					return
				default:
				}
				v := fmt.Sprintf("p%d-%d", p, i)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				pos, err := topic.Publish(ctx, keys[i%len(keys)], v)
				cancel()
				pr.mu.Lock()
				if err != nil {
					// The outcome is unknown: it may have been stored. The
					// check reads back what the partitions hold.
					pr.failed++
					pr.lastErr = err
				} else {
					pr.acked[pos], pr.ackedAt[pos] = v, time.Now()
					close(pr.more)
					pr.more = make(chan struct{})
				}
				pr.mu.Unlock()
			}
		})
	}
	return pr
}

// waitAcked waits until n more records than now were acknowledged, or
// fails the test after 60s.
func (pr *producer) waitAcked(t *testing.T, n int) {
	t.Helper()
	pr.mu.Lock()
	want := len(pr.acked) + n
	pr.mu.Unlock()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for {
		pr.mu.Lock()
		got, more := len(pr.acked), pr.more
		pr.mu.Unlock()
		if got >= want {
			return
		}
		select {
		case <-more:
		case <-deadline.C:
			t.Fatalf("%d records acknowledged after 60s, want %d", got, want)
		}
	}
}

// halt stops the producer and waits for its goroutines; idempotent.
func (pr *producer) halt() {
	select {
	case <-pr.stop:
	default:
		close(pr.stop)
	}
	pr.wg.Wait()
}

// ends returns, per partition, the offset past the last acknowledged one.
func (pr *producer) ends(parts int) []int64 {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	ends := make([]int64, parts)
	for pos := range pr.acked {
		ends[pos.Partition] = max(ends[pos.Partition], pos.Offset+1)
	}
	return ends
}

// firstAckAfter returns, per partition, the first acknowledgement after t
// (zero when none).
func (pr *producer) firstAckAfter(parts int, t time.Time) []time.Time {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	first := make([]time.Time, parts)
	for pos, at := range pr.ackedAt {
		if at.After(t) && (first[pos.Partition].IsZero() || at.Before(first[pos.Partition])) {
			first[pos.Partition] = at
		}
	}
	return first
}

// firstHandledFrom returns, per partition, when the first record at or
// past from[p] was handled (zero when none).
func firstHandledFrom(ds []delivery, from []int64) []time.Time {
	first := make([]time.Time, len(from))
	for _, d := range ds {
		p := d.partition
		if d.offset >= from[p] && (first[p].IsZero() || d.returned.Before(first[p])) {
			first[p] = d.returned
		}
	}
	return first
}

// since returns the largest of ts − t, and whether none of ts is zero.
func since(ts []time.Time, t time.Time) (time.Duration, bool) {
	var d time.Duration
	for _, x := range ts {
		if x.IsZero() {
			return 0, false
		}
		d = max(d, x.Sub(t))
	}
	return d, true
}

// recordStored records in hist every record the partitions of topic hold
// (a publish that failed may have been stored too: the group must handle
// it as well), and returns how many.
func recordStored(ctx context.Context, t *testing.T, js natsjs.JetStream, n names, topic string, parts int,
	hist *pubsubtest.History) int {
	t.Helper()
	stored := 0
	for p := range parts {
		s, err := js.Stream(ctx, n.stream(topic, p))
		if err != nil {
			t.Fatal(err)
		}
		last := s.CachedInfo().State.LastSeq
		for seq := uint64(1); seq <= last; seq++ {
			hist.Published(topic, pubsub.Position{Partition: p, Offset: int64(seq) - 1})
		}
		stored += int(last)
	}
	return stored
}

// checkAcked verifies that every record the producer had acknowledged was
// handled at its position with its value: that it is stored there.
func checkAcked(t *testing.T, pr *producer, ds []delivery) {
	t.Helper()
	handled := map[pubsub.Position]string{}
	for _, d := range ds {
		handled[pubsub.Position{Partition: d.partition, Offset: d.offset}] = d.value
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	lost := 0
	for pos, v := range pr.acked {
		if got, ok := handled[pos]; !ok || got != v {
			lost++
			if lost <= 10 {
				t.Errorf("acknowledged %q at %d@%d: handled %q there (%t)", v, pos.Partition, pos.Offset, got, ok)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged records lost", lost, len(pr.acked))
	}
}

// TestClusterNodeLoss kills (SIGKILL) the server leading most of a topic's
// partition streams, on a cluster of three with every stream, consumer and
// bucket R3, while a producer publishes to every partition and a group of
// two members consumes. Publishing and consuming resume on every
// partition within a bound (the servers elect new leaders 4-9s after the
// loss; measured and logged), a broker opened while the server is down
// joins the group and consumes, no acknowledged record is lost, and every
// stored record is handled; a record handled again is explained by its
// Attempt, an owner change, or the crash window (consumer state the dead
// leader had not replicated yet), whose size is logged and bounded.
func TestClusterNodeLoss(t *testing.T) {
	needCluster(t)
	c := startCluster(t, 3)
	const parts = 6
	hist, ds := pubsubtest.NewHistory(), &deliveries{}
	rb := &rebalances{} // m1's, from the kill on
	open := func(name string) *pubsub.Topic[string, string] {
		eng, err := Connect(c.connect(name), WithPrefix("loss"), WithReplicas(3), WithAckWait(2*time.Second),
			WithPollWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var opts []pubsub.BrokerOption
		if name == "m1" {
			opts = append(opts, pubsub.WithHooks(rb))
		}
		b := brokerOn(t, eng, opts...)
		if err := b.Err(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(parts),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 20}))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return topic
	}
	join := func(name string) *pubsub.Group[string] {
		g, err := open(name).Subscribe("billing", name, pubsubtest.Observe(hist, "orders", "billing", name, ds.handler(name)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return g
	}
	pub := open("publisher")
	g1, g2 := join("m1"), join("m2")
	waitOwners(t, map[string][]int{"m1": {0, 1, 2}, "m2": {3, 4, 5}}, g1, g2)

	prod := startProducer(pub, parts)
	defer prod.halt()
	prod.waitAcked(t, 600)

	// Kill the server leading most partition streams.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	js, err := natsjs.New(c.connect("checker"))
	if err != nil {
		t.Fatal(err)
	}
	n := names{prefix: encodeName("loss")}
	var streams []string
	for p := range parts {
		streams = append(streams, n.stream("orders", p))
	}
	leads, err := leaders(ctx, js, streams...)
	if err != nil {
		t.Fatal(err)
	}
	victim, led := c.mostLeader(leads)
	ends := prod.ends(parts)
	rebalancesBefore := rb.n.Load()
	c.kill(victim)
	killed := time.Now()
	hist.Repositioned("billing", "orders") // the crash window's repeats; crashWindow bounds them below
	t.Logf("killed %s, which led %d of the %d partition streams (leaders %v)", c.nodes[victim].cfg.Name, led, parts, leads)

	// Publishing and consuming resume on every partition. Polled: when is
	// up to the servers' election.
	const bound = 30 * time.Second
	var pubResumed, conResumed time.Duration
	var okp, okc bool
	if !poll(bound, func() bool {
		pubResumed, okp = since(prod.firstAckAfter(parts, killed), killed)
		conResumed, okc = since(firstHandledFrom(ds.all(), ends), killed)
		return okp && okc
	}) {
		t.Fatalf("%v after the kill: publishing resumed on every partition: %t, consuming: %t", bound, okp, okc)
	}
	t.Logf("after the kill every partition took a publish again within %v and handled a record published after it within %v",
		pubResumed.Round(10*time.Millisecond), conResumed.Round(10*time.Millisecond))
	for p, at := range firstHandledFrom(ds.all(), ends) {
		t.Logf("partition %d (leader was %s): publish again after %v, consumed after %v", p, leads[p],
			prod.firstAckAfter(parts, killed)[p].Sub(killed).Round(10*time.Millisecond), at.Sub(killed).Round(10*time.Millisecond))
	}

	t.Logf("m1 saw %d rebalances after the kill (MemberTTL 5s)", rb.n.Load()-rebalancesBefore)

	// A broker opened while the server is down, once the servers have
	// elected new leaders for everything it led (a request to an asset
	// still without one goes unanswered until the request timeout): it
	// joins the group and gets its share.
	assets := []asset{{stream: n.dlqStream("orders", "billing")}, {stream: n.redriveStream("orders", "billing")},
		{stream: "KV_" + n.bucket()}, {stream: "KV_" + n.bucket() + "_deals"}}
	for p := range parts {
		assets = append(assets, asset{stream: n.stream("orders", p)}, asset{n.stream("orders", p), n.consumer("billing", p)},
			asset{n.redriveStream("orders", "billing"), n.redriveConsumer(p)})
	}
	waitLeaders(t, js, assets)
	t.Logf("every stream and consumer had a leader again %v after the kill", time.Since(killed).Round(10*time.Millisecond))
	start := time.Now()
	g3 := join("m3")
	t.Logf("a broker opened and joined the group in %v with %s down", time.Since(start).Round(time.Millisecond),
		c.nodes[victim].cfg.Name)
	waitSpread(t, parts, []string{"m1", "m2", "m3"}, g1, g2, g3)
	prod.waitAcked(t, 600)
	prod.halt()

	// Everything stored is handled; nothing acknowledged was lost.
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	stored := recordStored(ctx, t, js, n, "orders", parts, hist)
	waitHandled(dctx, t, hist, stored)
	checkAcked(t, prod, ds.all())
	rep := hist.Check()
	if err := rep.Err(); err != nil {
		t.Error(err)
	}
	repeats, ages := crashWindow(ds.all(), killed)
	var oldest time.Duration
	for _, a := range ages {
		oldest = max(oldest, a)
	}
	prod.mu.Lock()
	failed, lastErr := prod.failed, prod.lastErr
	prod.mu.Unlock()
	t.Logf("%d records stored (%d publishes failed, the last with %v), %d deliveries; redeliveries %v; "+
		"%d repeats with the same Attempt and owner, the oldest handled %v before the kill",
		stored, failed, lastErr, rep.Deliveries, rep.Redeliveries, len(repeats), oldest.Round(time.Millisecond))
	for _, a := range ages {
		if a > 2*time.Second {
			t.Errorf("a record handled %v before the kill came again with the same Attempt: outside the crash window", a)
		}
	}
}

// waitHandled waits until the history's groups completed n distinct
// records, or ctx ends.
func waitHandled(ctx context.Context, t *testing.T, hist *pubsubtest.History, n int) {
	t.Helper()
	for {
		done := map[[2]int64]bool{}
		for _, e := range hist.Events() {
			if e.Kind == pubsubtest.End && e.Err == nil {
				done[[2]int64{int64(e.Partition), e.Offset}] = true
			}
		}
		if len(done) >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d records handled: %v", len(done), n, ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling the history: the handlers run in other brokers
		}
	}
}

// TestClusterServerRestartThenMemberCrash kills the server (SIGKILL) under a
// group of two members and starts it again on its store; once the members
// are back, one of them crashes (its connection closes without a
// goodbye): the other takes its partitions within the detection time
// (about MemberTTL and a third after the crashed member's last
// heartbeat), and consumes what is published after.
func TestClusterServerRestartThenMemberCrash(t *testing.T) {
	needCluster(t)
	c := startCluster(t, 1)
	const parts = 4
	const ttl = time.Second
	hist := pubsubtest.NewHistory()
	type member struct {
		b     *pubsub.Broker
		topic *pubsub.Topic[string, string]
		g     *pubsub.Group[string]
		close func()
	}
	open := func(name string, join bool) member {
		nc := c.connect(name)
		eng, err := Connect(nc, WithPrefix("restart"), WithMemberTTL(ttl), WithAckWait(2*time.Second),
			WithPollWait(50*time.Millisecond), WithRequestTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m := member{b: brokerOn(t, eng), close: nc.Close}
		if m.topic, err = pubsub.NewTopic(m.b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(parts)); err != nil {
			t.Fatal(err)
		}
		if join {
			h := pubsubtest.Observe(hist, "orders", "billing", name, pubsub.HandlerFunc[string](ignore))
			if m.g, err = m.topic.Subscribe("billing", name, h); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	pub, m1, m2 := open("publisher", false), open("m1", true), open("m2", true)
	waitOwners(t, map[string][]int{"m1": {0, 1}, "m2": {2, 3}}, m1.g, m2.g)

	c.kill(0)
	c.start(0)
	restarted := time.Now()
	js, err := natsjs.New(c.connect("checker"))
	if err != nil {
		t.Fatal(err)
	}
	n := names{prefix: encodeName("restart")}
	// The members are back once both heartbeat again (their keys written
	// since the restart), each broker follows the membership, and both
	// agree on the deal. Polled: reconnecting is the client's.
	back := poll(30*time.Second, func() bool {
		ok := true
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, n.bucket())
		for _, name := range []string{"m1", "m2"} {
			if err != nil {
				return false
			}
			e, err := kv.Get(ctx, n.memberKey("orders", "billing", name))
			ok = ok && err == nil && e.Created().After(restarted)
		}
		for _, m := range []member{m1, m2} {
			snap := m.b.Snapshot()
			ok = ok && len(snap.Topics) == 1 && len(snap.Topics[0].Groups) == 1 && snap.Topics[0].Groups[0].MembershipErr == nil
			asg := m.g.Assignment()
			ok = ok && len(asg["m1"]) == 2 && len(asg["m2"]) == 2
		}
		return ok
	})
	if !back {
		t.Fatalf("30s after the restart: m1 sees %v, m2 sees %v", m1.g.Assignment(), m2.g.Assignment())
	}
	t.Logf("both members back %v after the server restarted", time.Since(restarted).Round(10*time.Millisecond))

	m2.close()
	hist.Crashed("m2")
	crashed := time.Now()
	waitOwners(t, map[string][]int{"m1": {0, 1, 2, 3}}, m1.g)
	took := time.Since(crashed)
	t.Logf("m2's partitions taken over %v after it crashed (MemberTTL %v)", took.Round(10*time.Millisecond), ttl)
	if took > 3*ttl {
		t.Errorf("m2's partitions taken over %v after it crashed, want within about 4/3 MemberTTL (%v), at most %v", took, ttl, 3*ttl)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 200 {
		pos, err := pub.topic.Publish(ctx, fmt.Sprint("k", i), fmt.Sprint("v", i))
		if err != nil {
			t.Fatal(err)
		}
		hist.Published("orders", pos)
	}
	if err := m1.b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hist.Check().Err(); err != nil {
		t.Error(err)
	}
}

// TestClusterServerCrashRedelivery kills a server alone (SIGKILL) while a group
// consumes what a producer publishes, and starts it again on its store.
// The server writes a consumer's state to disk at most about ten times a
// second, so records committed in the last moments before the crash come
// again, with Attempt 1 and from the same member, offsets going back: the
// package documentation says so and tells handlers to deduplicate on
// Message.ID. The test measures that window (logged) and bounds it;
// nothing acknowledged is lost and every stored record is handled.
func TestClusterServerCrashRedelivery(t *testing.T) {
	needCluster(t)
	c := startCluster(t, 1)
	const parts = 4
	hist, ds := pubsubtest.NewHistory(), &deliveries{}
	open := func(name string) *pubsub.Topic[string, string] {
		eng, err := Connect(c.connect(name), WithPrefix("crash"), WithAckWait(2*time.Second),
			WithPollWait(50*time.Millisecond), WithRequestTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		topic, err := pubsub.NewTopic(brokerOn(t, eng), "orders", codec.String(), codec.String(), pubsub.WithPartitions(parts),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1 << 20}))
		if err != nil {
			t.Fatal(err)
		}
		return topic
	}
	pub := open("publisher")
	if _, err := open("m1").Subscribe("billing", "m1", pubsubtest.Observe(hist, "orders", "billing", "m1", ds.handler("m1"))); err != nil {
		t.Fatal(err)
	}
	prod := startProducer(pub, parts)
	defer prod.halt()
	prod.waitAcked(t, 2000)

	c.kill(0)
	killed := time.Now()
	hist.Repositioned("billing", "orders") // the crash window; measured and bounded below
	c.start(0)
	t.Logf("server restarted %v after the kill", time.Since(killed).Round(10*time.Millisecond))
	prod.waitAcked(t, 2000)
	prod.halt()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := natsjs.New(c.connect("checker"))
	if err != nil {
		t.Fatal(err)
	}
	stored := recordStored(ctx, t, js, names{prefix: encodeName("crash")}, "orders", parts, hist)
	waitHandled(ctx, t, hist, stored)
	checkAcked(t, prod, ds.all())
	rep := hist.Check()
	if err := rep.Err(); err != nil {
		t.Error(err)
	}
	repeats, ages := crashWindow(ds.all(), killed)
	perPartition := make([]int, parts)
	var oldest time.Duration
	for i, d := range repeats {
		perPartition[d.partition]++
		oldest = max(oldest, ages[i])
	}
	t.Logf("%d records stored, %d deliveries; %d came again with the same Attempt (per partition %v), "+
		"the oldest handled %v before the kill; redeliveries %v",
		stored, rep.Deliveries, len(repeats), perPartition, oldest.Round(time.Millisecond), rep.Redeliveries)
	if oldest > time.Second {
		t.Errorf("a record handled %v before the crash came again with the same Attempt: want at most about 100ms (1s allowed)", oldest)
	}
}
