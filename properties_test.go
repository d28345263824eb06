package logbus_test

// The property suite: a model-based, Jepsen-style test of the queue through
// its public API only.
//
// rapid drives a state machine (the actions below) against one broker and
// one topic whose shape (partitions, retention, retry policy) is drawn per
// run. Every action waits for the system to go quiet (synctest.Wait) before
// the next, so a run is a sequence of well-defined states that rapid can
// replay and shrink, while inside each action producers, workers, backoffs
// and rebalances still run concurrently. Everything runs in a
// testing/synctest bubble: backoffs, BlockTimeouts and age retention happen
// in virtual time, exactly and instantly.
//
// Everything observable is appended to a history: publish results,
// handler calls with their outcome and epoch, dead letters, seeks. The
// invariants are checked over that history after every action, after every
// drain, and after Close. Each check is named for the invariant it guards,
// and its failure message shows the offending events.
//
// Vocabulary: an epoch of a (group, partition) is the span between two
// repositionings of its cursor (Seek or Replay). Within an epoch the cursor
// only moves forward.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestQueueProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rapid.SyncTest(t, func(t *rapid.T) {
			m := newMachine(t)
			t.Repeat(rapid.StateMachineActions(m))
			m.closeAndCheck(t)
		})
	})
}

// A job is the value every record carries: its sequence number, and the
// fault its handlers must act out. The fault travels in the record, so every
// group and every redelivery acts it out the same way.
type job struct {
	Seq   int
	Fault fault
	K     int  // for transient: the attempts that fail, per epoch
	Slow  bool // the handler takes 10ms of virtual time: a window for overlaps and for rebalances, seeks and Close to meet a delivery in flight
}

type fault int

const (
	faultNone        fault = iota
	faultTransient         // fails its first K attempts, then acks
	faultPermanent         // fails wrapping ErrPermanent: dead-lettered after 1 attempt
	faultPanic             // panics on every attempt: dead-lettered after MaxAttempts
	faultUndecodable       // its bytes fail to decode: dead-lettered, handler never called
)

var errUndecodable = errors.New("undecodable job")

var jobCodec = codec.Func(
	func(j job) ([]byte, error) { return fmt.Appendf(nil, "%d|%d|%d|%t", j.Seq, j.Fault, j.K, j.Slow), nil },
	func(b []byte) (job, error) {
		parts := strings.Split(string(b), "|")
		if len(parts) != 4 {
			return job{}, fmt.Errorf("job %q: %w", b, errUndecodable)
		}
		var j job
		var f int
		var errs [4]error
		j.Seq, errs[0] = strconv.Atoi(parts[0])
		f, errs[1] = strconv.Atoi(parts[1])
		j.K, errs[2] = strconv.Atoi(parts[2])
		j.Slow, errs[3] = strconv.ParseBool(parts[3])
		j.Fault = fault(f)
		if err := errors.Join(errs[:]...); err != nil || j.Fault == faultUndecodable {
			return job{}, fmt.Errorf("job %q: %w", b, errUndecodable)
		}
		return j, nil
	},
)

type gp struct {
	group     string
	partition int
}

type gpEpoch struct {
	gp
	epoch int
}

// call is one handler invocation.
type call struct {
	group, consumer string
	partition       int
	offset          int64
	attempt         int
	seq             int
	epoch           int
	acked           bool
}

func (c call) String() string {
	outcome := "nack"
	if c.acked {
		outcome = "ack"
	}
	return fmt.Sprintf("%s/%s p%d@%d seq %d attempt %d epoch %d: %s",
		c.group, c.consumer, c.partition, c.offset, c.seq, c.attempt, c.epoch, outcome)
}

// published is the model's record of one successful publish.
type published struct {
	job       job
	key       string
	partition int
	offset    int64
}

// epoch is one span of a (group, partition) cursor.
type epoch struct {
	start  int64
	stop   int64 // the committed offset when the epoch ended; for the current one, read at check time
	closed bool
	acked  map[int64]int // offset → acks within the epoch
	dead   map[int64]int // offset → dead letters within the epoch
}

func newEpoch(start int64) *epoch {
	return &epoch{start: start, acked: map[int64]int{}, dead: map[int64]int{}}
}

type machine struct {
	b           *pubsub.Broker
	topic       *pubsub.Topic[string, job]
	partitions  int
	retention   pubsub.Retention
	maxAttempts int

	keys      []string
	groups    map[string]*pubsub.Group[job]
	members   map[string][]string // the model's membership, in join order
	paused    map[string]bool
	nextSeq   int
	bySeq     map[int]published
	failedSeq map[int]error
	byPos     map[pubsub.Position]int // where each seq landed

	backpressured int64
	// droppedGroupless is what the topic had dropped when the first group
	// subscribed: under Block, a full partition no group reads drops its
	// oldest record, and only then.
	droppedGroupless int64
	// drops predicted by the model for single publishes, per partition
	// stats snapshot: see Publish.

	mu         sync.Mutex // guards the fields below: handlers write them
	calls      []call
	inflight   map[gp]int
	epochIdx   map[gp]int
	violations []string

	epochs        map[gp][]*epoch
	lastCommitted map[gp]int64
	seenCalls     int              // calls already folded into epochs
	seenDead      map[string]int   // dead letters already folded, per group
	undecodable   map[string]int   // dead letters of undecodable records, per group
	finalFailures map[string]int   // handler calls that ended in a dead letter, per group
	lastCall      map[gpEpoch]call // the latest call of each epoch of each (group, partition)
}

func newMachine(t *rapid.T) *machine {
	m := &machine{
		partitions:  rapid.IntRange(1, 8).Draw(t, "partitions"),
		maxAttempts: rapid.IntRange(1, 4).Draw(t, "maxAttempts"),
		keys:        rapid.SampledFrom([][]string{{"a"}, {"a", "b"}, {"a", "b", "c", "d", "e"}}).Draw(t, "keys"),
		groups:      map[string]*pubsub.Group[job]{},
		members:     map[string][]string{},
		paused:      map[string]bool{},
		bySeq:       map[int]published{},
		failedSeq:   map[int]error{},
		byPos:       map[pubsub.Position]int{},
		inflight:    map[gp]int{},
		epochIdx:    map[gp]int{},
		epochs:      map[gp][]*epoch{},
		seenDead:    map[string]int{},
		undecodable: map[string]int{},

		finalFailures: map[string]int{},
		lastCall:      map[gpEpoch]call{},

		lastCommitted: map[gp]int64{},
	}
	m.retention = pubsub.Retention{
		MaxMessages:  rapid.IntRange(1, 12).Draw(t, "maxMessages"),
		OnFull:       rapid.SampledFrom([]pubsub.FullPolicy{pubsub.Block, pubsub.DropOldest}).Draw(t, "onFull"),
		MaxAge:       rapid.SampledFrom([]time.Duration{0, 0, 5 * time.Second, time.Minute}).Draw(t, "maxAge"),
		BlockTimeout: rapid.SampledFrom([]time.Duration{time.Millisecond, 100 * time.Millisecond, 2 * time.Second}).Draw(t, "blockTimeout"),
	}
	retry := pubsub.RetryPolicy{
		MaxAttempts: m.maxAttempts,
		BaseDelay:   rapid.SampledFrom([]time.Duration{time.Millisecond, 50 * time.Millisecond, time.Second}).Draw(t, "baseDelay"),
		Multiplier:  2,
		MaxDelay:    5 * time.Second,
	}
	m.b = pubsub.NewBroker(pubsub.WithRetry(retry))
	t.Cleanup(func() {
		// After a failure, stop the workers anyway: the bubble must end
		// with no goroutine left. After closeAndCheck this is a no-op.
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		_ = m.b.Close(ctx)
	})
	var err error
	m.topic, err = pubsub.NewTopic(m.b, "jobs", codec.String(), jobCodec,
		pubsub.WithPartitions(m.partitions), pubsub.WithRetention(m.retention))
	if err != nil {
		t.Fatalf("NewTopic: %v", err)
	}
	return m
}

// ---- actions ----

func (m *machine) drawJob(t *rapid.T) job {
	m.nextSeq++
	j := job{Seq: m.nextSeq}
	j.Fault = rapid.SampledFrom([]fault{
		faultNone, faultNone, faultNone, faultNone, faultNone, faultNone,
		faultTransient, faultTransient, faultPermanent, faultPanic, faultUndecodable,
	}).Draw(t, "fault")
	if j.Fault == faultTransient {
		j.K = rapid.IntRange(1, 4).Draw(t, "failures")
	}
	j.Slow = rapid.IntRange(0, 9).Draw(t, "slow") == 0
	return j
}

// Publish publishes one record and checks where it landed. Under DropOldest
// without age retention the model predicts exactly whether the publish
// evicts a record.
func (m *machine) Publish(t *rapid.T) {
	j := m.drawJob(t)
	key := rapid.SampledFrom(append([]string{""}, m.keys...)).Draw(t, "key")
	before := m.topic.Stats()
	wantDrop := m.predictDrop(key)
	pos, err := m.publish(key, j)
	m.recordPublish(t, []publishResult{{key: key, job: j, pos: pos, err: err}})
	if wantDrop >= 0 && err == nil {
		if got := m.topic.Stats().Dropped - before.Dropped; got != int64(wantDrop) {
			t.Fatalf("accounting: publishing seq %d to partition %d dropped %d records, the model predicts %d",
				j.Seq, pos.Partition, got, wantDrop)
		}
	}
}

// PublishBurst publishes from several goroutines at once.
func (m *machine) PublishBurst(t *rapid.T) {
	producers := rapid.IntRange(2, 4).Draw(t, "producers")
	per := rapid.IntRange(1, 5).Draw(t, "perProducer")
	type plan struct {
		key string
		job job
	}
	plans := make([][]plan, producers)
	for p := range plans {
		for range per {
			key := rapid.SampledFrom(append([]string{""}, m.keys...)).Draw(t, "key")
			plans[p] = append(plans[p], plan{key, m.drawJob(t)})
		}
	}
	results := make([][]publishResult, producers)
	var wg sync.WaitGroup
	for p := range plans {
		wg.Go(func() {
			for _, pl := range plans[p] {
				pos, err := m.publish(pl.key, pl.job)
				results[p] = append(results[p], publishResult{key: pl.key, job: pl.job, pos: pos, err: err})
			}
		})
	}
	wg.Wait()
	m.recordPublish(t, slices.Concat(results...))
}

type publishResult struct {
	key string
	job job
	pos pubsub.Position
	err error
	// unattempted marks the entries of a batch after the one that failed:
	// not published, and not a failed publish of their own.
	unattempted bool
}

// PublishBatch publishes a batch in one call: keyed entries with
// PublishBatch, or keyless ones with PublishValues. The positions it
// returns are checked like single publishes' (density, routing); the
// entries after a failure are not in the log.
func (m *machine) PublishBatch(t *rapid.T) {
	size := rapid.IntRange(1, 8).Draw(t, "batchSize")
	keyless := rapid.Bool().Draw(t, "keyless")
	var entries []pubsub.Entry[string, job]
	for range size {
		e := pubsub.Entry[string, job]{Value: m.drawJob(t)}
		if !keyless {
			e.Key = rapid.SampledFrom(m.keys).Draw(t, "key")
		}
		entries = append(entries, e)
	}
	var positions []pubsub.Position
	var err error
	if keyless {
		values := make([]job, len(entries))
		for i, e := range entries {
			values[i] = e.Value
		}
		positions, err = m.topic.PublishValues(context.Background(), values)
	} else {
		positions, err = m.topic.PublishBatch(context.Background(), entries)
	}
	if len(positions) > len(entries) || (err == nil) != (len(positions) == len(entries)) {
		t.Fatalf("PublishBatch of %d: got %d positions and error %v", len(entries), len(positions), err)
	}
	results := make([]publishResult, len(entries))
	for i, e := range entries {
		results[i] = publishResult{key: e.Key, job: e.Value}
		switch {
		case i < len(positions):
			results[i].pos = positions[i]
		case i == len(positions):
			results[i].err = err
		default:
			results[i].err, results[i].unattempted = err, true
		}
	}
	m.recordPublish(t, results)
}

func (m *machine) publish(key string, j job) (pubsub.Position, error) {
	if key == "" {
		return m.topic.PublishValue(context.Background(), j)
	}
	return m.topic.Publish(context.Background(), key, j)
}

// predictDrop returns 1 when publishing to key's partition must evict a
// record, 0 when it must not, and -1 when the model cannot tell (keyless
// records, Block, age retention).
func (m *machine) predictDrop(key string) int {
	if key == "" || m.retention.OnFull != pubsub.DropOldest || m.retention.MaxAge != 0 {
		return -1
	}
	p := pubsub.KeyHash().Partition([]byte(key), m.partitions)
	earliest, end, _ := m.topic.Offsets(p)
	if end-earliest < int64(m.retention.MaxMessages) {
		return 0
	}
	if len(m.groups) == 0 {
		return 1 // nothing is reclaimed while no group is subscribed: it is dropped
	}
	low := end
	for _, g := range m.groups {
		low = min(low, g.Committed(p))
	}
	if low > earliest {
		return 0 // reclaim frees room
	}
	return 1
}

// recordPublish folds publish results into the model and checks offset
// uniqueness and density (invariant 1): the successful publishes to a
// partition take exactly the offsets after its previous end, each once.
func (m *machine) recordPublish(t *rapid.T, results []publishResult) {
	ends := map[int]int64{}
	for _, p := range m.bySeq {
		ends[p.partition] = max(ends[p.partition], p.offset+1)
	}
	got := map[int][]int64{}
	for _, r := range results {
		if r.err != nil {
			if !errors.Is(r.err, pubsub.ErrBackpressure) {
				t.Fatalf("publish seq %d: unexpected error %v", r.job.Seq, r.err)
			}
			if !r.unattempted {
				m.backpressured++
			}
			m.failedSeq[r.job.Seq] = r.err
			continue
		}
		if prev, ok := m.byPos[r.pos]; ok {
			t.Fatalf("offsets: seq %d and seq %d both landed at %+v", prev, r.job.Seq, r.pos)
		}
		if r.key != "" {
			if want := pubsub.KeyHash().Partition([]byte(r.key), m.partitions); r.pos.Partition != want {
				t.Fatalf("routing: key %q went to partition %d, want %d", r.key, r.pos.Partition, want)
			}
		}
		m.byPos[r.pos] = r.job.Seq
		m.bySeq[r.job.Seq] = published{job: r.job, key: r.key, partition: r.pos.Partition, offset: r.pos.Offset}
		got[r.pos.Partition] = append(got[r.pos.Partition], r.pos.Offset)
	}
	for p, offs := range got {
		slices.Sort(offs)
		for i, off := range offs {
			if want := ends[p] + int64(i); off != want {
				t.Fatalf("offsets: partition %d handed out %v after end %d: not dense", p, offs, ends[p])
			}
		}
		if _, end, _ := m.topic.Offsets(p); end != ends[p]+int64(len(offs)) {
			t.Fatalf("offsets: partition %d ends at %d, model says %d", p, end, ends[p]+int64(len(offs)))
		}
	}
}

func (m *machine) drawGroup(t *rapid.T) string {
	return rapid.SampledFrom([]string{"g0", "g1", "g2"}).Draw(t, "group")
}

func (m *machine) existingGroup(t *rapid.T) (string, *pubsub.Group[job]) {
	if len(m.groups) == 0 {
		t.Skip("no group yet")
	}
	name := rapid.SampledFrom(slices.Sorted(maps.Keys(m.groups))).Draw(t, "group")
	return name, m.groups[name]
}

func (m *machine) Subscribe(t *rapid.T) {
	group := m.drawGroup(t)
	consumer := rapid.SampledFrom([]string{"c0", "c1", "c2", "c3"}).Draw(t, "consumer")
	if slices.Contains(m.members[group], consumer) {
		_, err := m.topic.Subscribe(group, consumer, m.handler(group, consumer))
		if !errors.Is(err, pubsub.ErrSubscription) {
			t.Fatalf("subscribing %s twice to %s: got %v, want ErrSubscription", consumer, group, err)
		}
		return
	}
	if _, ok := m.groups[group]; !ok {
		if len(m.groups) == 0 {
			m.droppedGroupless = m.topic.Stats().Dropped
		}
		// A new group starts at the earliest retained record of every
		// partition.
		m.mu.Lock()
		for p := range m.partitions {
			earliest, _, _ := m.topic.Offsets(p)
			m.epochs[gp{group, p}] = []*epoch{newEpoch(earliest)}
			m.lastCommitted[gp{group, p}] = earliest
		}
		m.mu.Unlock()
	}
	g, err := m.topic.Subscribe(group, consumer, m.handler(group, consumer), pubsub.WithDeadLetterLimit(1<<20))
	if err != nil {
		t.Fatalf("Subscribe(%s, %s): %v", group, consumer, err)
	}
	if prev, ok := m.groups[group]; ok && prev != g {
		t.Fatalf("Subscribe returned a second *Group for %s", group)
	}
	m.groups[group] = g
	m.members[group] = append(m.members[group], consumer)
	m.checkAssignment(t, group)
}

func (m *machine) Leave(t *rapid.T) {
	group, g := m.existingGroup(t)
	if len(m.members[group]) == 0 {
		t.Skip("no members")
	}
	consumer := rapid.SampledFrom(m.members[group]).Draw(t, "consumer")
	if err := g.Leave(context.Background(), consumer); err != nil {
		t.Fatalf("Leave(%s, %s): %v", group, consumer, err)
	}
	m.members[group] = slices.DeleteFunc(m.members[group], func(c string) bool { return c == consumer })
	m.checkAssignment(t, group)
}

// checkAssignment: every partition has exactly one owner among the members
// (invariant 4's static half), and shares differ by at most one.
func (m *machine) checkAssignment(t *rapid.T, group string) {
	a := m.groups[group].Assignment()
	if !slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(slices.Values(m.members[group]))) {
		t.Fatalf("ownership: assignment %v of %s does not list exactly the members %v", a, group, m.members[group])
	}
	owners := map[int]string{}
	lo, hi := m.partitions, 0
	for c, ps := range a {
		lo, hi = min(lo, len(ps)), max(hi, len(ps))
		for _, p := range ps {
			if prev, ok := owners[p]; ok {
				t.Fatalf("ownership: partition %d of %s owned by %s and %s", p, group, prev, c)
			}
			owners[p] = c
		}
	}
	if len(a) > 0 && (len(owners) != m.partitions || hi-lo > 1) {
		t.Fatalf("ownership: assignment %v of %s is incomplete or unbalanced", a, group)
	}
}

func (m *machine) Pause(t *rapid.T) {
	group, g := m.existingGroup(t)
	if err := g.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.paused[group] = true
}

func (m *machine) Resume(t *rapid.T) {
	group, g := m.existingGroup(t)
	if err := g.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.paused[group] = false
}

func (m *machine) Seek(t *rapid.T) {
	group, g := m.existingGroup(t)
	defer m.quiesce(group, g)()
	p := rapid.IntRange(0, m.partitions-1).Draw(t, "partition")
	earliest, end, _ := m.topic.Offsets(p)
	offset := rapid.Int64Range(max(0, earliest-1), end+1).Draw(t, "offset")
	valid := offset >= earliest && offset <= end
	if valid {
		m.newEpoch(group, p, g.Committed(p), offset) // paused: the cursor stays put until the seek
	}
	err := g.Seek(context.Background(), p, offset)
	switch {
	case valid && err != nil:
		t.Fatalf("Seek(%s, %d, %d) in [%d, %d]: %v", group, p, offset, earliest, end, err)
	case !valid && !errors.Is(err, pubsub.ErrOffsetOutOfRange):
		t.Fatalf("Seek(%s, %d, %d) outside [%d, %d]: got %v, want ErrOffsetOutOfRange", group, p, offset, earliest, end, err)
	}
}

func (m *machine) Replay(t *rapid.T) {
	group, g := m.existingGroup(t)
	defer m.quiesce(group, g)()
	from := rapid.Int64Range(0, 12).Draw(t, "from")
	asked := make([]int64, m.partitions) // where each partition should go, as the model sees it now
	stops := make([]int64, m.partitions) // where the old epochs end: the group is paused, so nothing commits
	for p := range m.partitions {
		earliest, end, _ := m.topic.Offsets(p)
		asked[p] = min(max(from, earliest), end)
		stops[p] = g.Committed(p)
	}
	if err := g.Replay(context.Background(), pubsub.AtOffset(from)); err != nil {
		t.Fatalf("Replay(%s, %d): %v", group, from, err)
	}
	// The group is paused, so its cursors are where the replay put them.
	// That can be past what the model asked for: seeking one partition
	// wakes the producers blocked on it, and their next appends, to
	// partitions not sought yet, can trim records that aged out.
	for p := range m.partitions {
		start := g.Committed(p)
		if earliest, _, _ := m.topic.Offsets(p); start < asked[p] || start > max(asked[p], earliest) {
			t.Fatalf("Replay(%s, %d): partition %d at %d, want %d or, if retention trimmed meanwhile, up to %d",
				group, from, p, start, asked[p], earliest)
		}
		m.newEpoch(group, p, stops[p], start)
	}
}

// quiesce pauses group, unless it is paused already, and waits until every
// goroutine of the bubble is blocked; the function it returns resumes the
// group. The model of a seek reads the retained range and the committed
// offset before the call: that is exact only if nothing moves them during
// the call. A running group's seek waits for its deliveries in flight, and
// while it waits virtual time can pass, age retention can trim, and the seek
// then clamps to an earliest offset the model never saw (found by this
// suite: a replay that started past records nobody counted as skipped).
// Paused and quiet, the group's seek waits for nothing, so no time passes
// and nothing else runs until it is done.
func (m *machine) quiesce(group string, g *pubsub.Group[job]) (resume func()) {
	if m.paused[group] {
		return func() {}
	}
	if err := g.Pause(context.Background()); err != nil {
		panic(err) // nothing holds a delivery here: Pause cannot time out
	}
	synctest.Wait()
	return func() { _ = g.Resume(context.Background()) }
}

// newEpoch closes the current epoch of (group, p) at stop, where the
// group's cursor was before the seek, and opens one at start.
func (m *machine) newEpoch(group string, p int, stop, start int64) {
	m.foldHistory() // attribute what happened so far to the old epoch
	k := gp{group, p}
	m.mu.Lock()
	defer m.mu.Unlock()
	eps := m.epochs[k]
	cur := eps[len(eps)-1]
	cur.stop, cur.closed = stop, true
	m.epochs[k] = append(eps, newEpoch(start))
	m.epochIdx[k]++
	m.lastCommitted[k] = start
}

// Advance moves virtual time: backoffs end, age retention trims.
func (m *machine) Advance(t *rapid.T) {
	time.Sleep(rapid.SampledFrom( // virtual time: the suite runs in a synctest bubble
		[]time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second}).Draw(t, "sleep"))
}

// Drain waits for every group to catch up, then checks that it did
// (invariant 5); or, when a group with lag cannot move (paused, or without
// members), checks that Drain said so at once, naming each such group.
func (m *machine) Drain(t *rapid.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	err := m.b.Drain(ctx)
	var stalled []string
	for group, g := range m.groups {
		if (len(m.members[group]) == 0 || m.paused[group]) && g.Lag() > 0 {
			stalled = append(stalled, group)
		}
	}
	if len(stalled) > 0 {
		if !errors.Is(err, pubsub.ErrStalled) {
			t.Fatalf("Drain with stalled groups %v: got %v, want ErrStalled", stalled, err)
		}
		for _, group := range stalled {
			if !strings.Contains(err.Error(), fmt.Sprintf("group %q", group)) {
				t.Fatalf("Drain: %v does not name the stalled group %s", err, group)
			}
		}
		return
	}
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	for group, g := range m.groups {
		if len(m.members[group]) == 0 || m.paused[group] {
			continue
		}
		for p := range m.partitions {
			if _, end, _ := m.topic.Offsets(p); g.Committed(p) != end {
				t.Fatalf("at-least-once: after Drain, %s committed %d of partition %d, end %d", group, g.Committed(p), p, end)
			}
		}
	}
}

// ---- the handler ----

func (m *machine) handler(group, consumer string) pubsub.HandlerFunc[job] {
	return func(_ context.Context, msg pubsub.Message[job]) error {
		k := gp{group, msg.Partition}
		m.mu.Lock()
		m.inflight[k]++
		if m.inflight[k] > 1 {
			m.violations = append(m.violations, fmt.Sprintf(
				"ownership: two handler calls in flight for %s partition %d (%s at offset %d)", group, msg.Partition, consumer, msg.Offset))
		}
		ep := m.epochIdx[k]
		m.mu.Unlock()
		if msg.Value.Slow {
			time.Sleep(10 * time.Millisecond) // virtual time, in the bubble
		}

		var err error
		panicking := false
		switch msg.Value.Fault {
		case faultTransient:
			if msg.Attempt <= msg.Value.K {
				err = fmt.Errorf("transient failure %d of %d", msg.Attempt, msg.Value.K)
			}
		case faultPermanent:
			err = fmt.Errorf("seq %d: %w", msg.Value.Seq, pubsub.ErrPermanent)
		case faultPanic:
			panicking = true
		case faultUndecodable:
			err = fmt.Errorf("seq %d reached a handler though it cannot be decoded", msg.Value.Seq)
			m.mu.Lock()
			m.violations = append(m.violations, "decode: "+err.Error())
			m.mu.Unlock()
		}
		m.mu.Lock()
		m.inflight[k]--
		m.calls = append(m.calls, call{group: group, consumer: consumer, partition: msg.Partition, offset: msg.Offset,
			attempt: msg.Attempt, seq: msg.Value.Seq, epoch: ep, acked: err == nil && !panicking})
		m.mu.Unlock()
		if panicking {
			panic(fmt.Sprintf("poison seq %d", msg.Value.Seq))
		}
		return err
	}
}

// finalFailure reports whether a failed attempt is the record's last in its
// epoch: the record is dead-lettered after it.
func (m *machine) finalFailure(j job, attempt int) bool {
	return j.Fault == faultPermanent || attempt >= m.maxAttempts
}

// ---- invariants ----

// Check runs after every action, once the system is quiet.
func (m *machine) Check(t *rapid.T) {
	synctest.Wait()
	m.mu.Lock()
	violations := slices.Clone(m.violations)
	m.mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d violations, first: %s", len(violations), violations[0])
	}
	m.checkCalls(t)
	m.foldHistory()
	for group, g := range m.groups {
		if n, want := len(g.DeadLetters()), m.finalFailures[group]+m.undecodable[group]; n != want {
			t.Fatalf("dead letters: %s holds %d, but %d calls failed for good and %d records were undecodable",
				group, n, m.finalFailures[group], m.undecodable[group])
		}
	}
	m.checkCommits(t)
	m.checkAccounting(t)
	m.checkTopicStats(t)
}

// foldHistory folds the new dead letters of each group into the model. A
// dead letter of a record that reached a handler is accounted where that
// handler call is (checkCalls: its final failure); here only the records
// that cannot be decoded, which never reach a handler, are attributed, to
// the current epoch of their partition. That is exact: such a record is
// dead-lettered at once, so the system being quiet means it is done, and
// every repositioning folds first. Then the two sources must agree: as many
// dead letters as final failures plus undecodable records.
func (m *machine) foldHistory() {
	for group, g := range m.groups {
		letters := g.DeadLetters()
		m.mu.Lock()
		for _, l := range letters[m.seenDead[group]:] {
			pos := pubsub.Position{Partition: l.Message.Partition, Offset: l.Message.Offset}
			if m.bySeq[m.byPos[pos]].job.Fault == faultUndecodable {
				k := gp{group, l.Message.Partition}
				eps := m.epochs[k]
				eps[len(eps)-1].dead[l.Message.Offset]++
				m.undecodable[group]++
			}
		}
		m.seenDead[group] = len(letters)
		m.mu.Unlock()
		m.checkDeadLetters(letters)
	}
}

// checkDeadLetters: invariant 8. A dead letter is a record whose fault says
// it must die, after exactly the attempts its fault allows, with an error
// of the right kind.
func (m *machine) checkDeadLetters(letters []pubsub.DeadLetter[job]) {
	for _, l := range letters {
		seq, ok := m.byPos[pubsub.Position{Partition: l.Message.Partition, Offset: l.Message.Offset}]
		j := m.bySeq[seq].job
		var want int
		var wantErr bool
		switch j.Fault {
		case faultPermanent:
			want, wantErr = 1, errors.Is(l.Err, pubsub.ErrPermanent)
		case faultUndecodable:
			_, isDecode := errors.AsType[*pubsub.DecodeError](l.Err)
			want, wantErr = 1, isDecode && errors.Is(l.Err, errUndecodable)
		case faultPanic:
			_, isPanic := errors.AsType[*pubsub.PanicError](l.Err)
			want, wantErr = m.maxAttempts, isPanic
		case faultTransient:
			want, wantErr = m.maxAttempts, j.K >= m.maxAttempts && l.Err != nil
		}
		if !ok || want == 0 || l.Attempts != want || !wantErr {
			m.mu.Lock()
			m.violations = append(m.violations, fmt.Sprintf(
				"dead letters: p%d@%d (seq %d, fault %d, K %d) dead-lettered after %d attempts with %v; want %d attempts",
				l.Message.Partition, l.Message.Offset, seq, j.Fault, j.K, l.Attempts, l.Err, want))
			m.mu.Unlock()
		}
	}
}

// checkCalls walks the handler calls not seen yet:
//   - invariant 1: each call carries the record published at its position;
//   - invariant 2: no record whose publish failed is ever delivered;
//   - invariant 3: within an epoch, a partition's calls never go back to an
//     earlier offset. (A call may move on past a record without an outcome
//     when retention evicted that record while it waited for a retry; the
//     accounting check holds such a record to the group's Skipped count.)
//   - invariant 6: every repeated call is explained: attempt n+1 of an
//     offset follows a failed, non-final attempt n in the same epoch.
func (m *machine) checkCalls(t *rapid.T) {
	m.mu.Lock()
	calls := m.calls[m.seenCalls:]
	m.seenCalls = len(m.calls)
	m.mu.Unlock()
	for _, c := range calls {
		pos := pubsub.Position{Partition: c.partition, Offset: c.offset}
		seq, ok := m.byPos[pos]
		if !ok || seq != c.seq {
			t.Fatalf("consistency: %v carries seq %d, but seq %d (found %v) was published there", c, c.seq, seq, ok)
		}
		if err, failed := m.failedSeq[c.seq]; failed {
			t.Fatalf("aborted read: %v delivers a record whose publish failed with %v", c, err)
		}
		k := gp{c.group, c.partition}
		ke := gpEpoch{k, c.epoch}
		prev, hasPrev := m.lastCall[ke]
		switch {
		case !hasPrev || c.offset > prev.offset:
			if c.attempt != 1 {
				t.Fatalf("duplicates: %v is the first call for its offset in its epoch but has attempt %d", c, c.attempt)
			}
		case c.offset < prev.offset:
			t.Fatalf("order: %v went back from %v within an epoch", c, prev)
		default: // the same offset again
			if prev.acked || m.finalFailure(m.bySeq[prev.seq].job, prev.attempt) || c.attempt != prev.attempt+1 {
				t.Fatalf("duplicates: %v after %v is not explained by a retry", c, prev)
			}
		}
		m.lastCall[ke] = c
		m.mu.Lock()
		switch e := m.epochs[k][c.epoch]; {
		case c.acked:
			e.acked[c.offset]++
		case m.finalFailure(m.bySeq[c.seq].job, c.attempt):
			e.dead[c.offset]++
			m.finalFailures[c.group]++
		}
		m.mu.Unlock()
	}
}

// checkCommits: invariant 7. Within an epoch a committed offset never moves
// backwards, and never past the end.
func (m *machine) checkCommits(t *rapid.T) {
	for group, g := range m.groups {
		for p := range m.partitions {
			k := gp{group, p}
			c := g.Committed(p)
			_, end, _ := m.topic.Offsets(p)
			if c < m.lastCommitted[k] || c > end {
				t.Fatalf("commits: %s partition %d committed %d, was %d, end %d", group, p, c, m.lastCommitted[k], end)
			}
			m.lastCommitted[k] = c
		}
	}
}

// checkAccounting: invariants 5, 8 and 9. In every epoch of every (group,
// partition), each offset the cursor passed has at most one final outcome
// (one ack or one dead letter), every final outcome lies below the cursor
// (every ack is reflected in the committed offset), and the offsets the
// cursor passed without an outcome are exactly the ones the group counted
// as Skipped: nothing is lost silently. The group counts as Delivered
// exactly the acks its handlers gave.
func (m *machine) checkAccounting(t *rapid.T) {
	for group, g := range m.groups {
		var unexplained, acks int64
		for p := range m.partitions {
			k := gp{group, p}
			committed := g.Committed(p)
			m.mu.Lock()
			eps := slices.Clone(m.epochs[k])
			m.mu.Unlock()
			for i, e := range eps {
				stop := e.stop // read with the group paused, nothing in flight (see quiesce)
				if !e.closed {
					stop = committed
				}
				finals := 0
				for off, n := range e.acked {
					finals++
					acks += int64(n)
					if n+e.dead[off] > 1 || off < e.start || off >= stop {
						t.Fatalf("at-least-once: %s p%d epoch %d [%d, %d): offset %d acked %d times and dead-lettered %d times",
							group, p, i, e.start, stop, off, n, e.dead[off])
					}
				}
				for off, n := range e.dead {
					if e.acked[off] == 0 {
						finals++
					}
					if n > 1 || off < e.start || off >= stop {
						t.Fatalf("dead letters: %s p%d epoch %d [%d, %d): offset %d dead-lettered %d times",
							group, p, i, e.start, stop, off, n)
					}
				}
				unexplained += stop - e.start - int64(finals)
			}
		}
		stats := g.Stats()
		if unexplained != stats.Skipped {
			t.Fatalf("accounting: %s passed %d offsets without an outcome but counted %d skipped", group, unexplained, stats.Skipped)
		}
		if acks != stats.Delivered {
			t.Fatalf("accounting: %s's handlers acked %d times but it counted %d delivered", group, acks, stats.Delivered)
		}
	}
}

// checkTopicStats: invariant 9 for the topic. Every record that left the log
// is counted once, drops happen only under DropOldest or while no group is
// subscribed, expiry only with MaxAge, and every ErrBackpressure was
// counted.
func (m *machine) checkTopicStats(t *rapid.T) {
	s := m.topic.Stats()
	switch {
	case s.Published != int64(len(m.bySeq)):
		t.Fatalf("accounting: topic says %d published, the model %d", s.Published, len(m.bySeq))
	case s.Published-int64(s.Retained) != s.Reclaimed+s.Dropped+s.Expired:
		t.Fatalf("accounting: %+v: trimmed records not counted exactly once", s)
	case m.retention.OnFull != pubsub.DropOldest && len(m.groups) > 0 && s.Dropped != m.droppedGroupless:
		t.Fatalf("accounting: %+v: drops under Block after a group subscribed (%d before)", s, m.droppedGroupless)
	case s.Expired > 0 && m.retention.MaxAge == 0:
		t.Fatalf("accounting: %+v: expiry without MaxAge", s)
	case s.TimedOut != m.backpressured:
		t.Fatalf("accounting: %d publishes failed with ErrBackpressure, the topic counted %d", m.backpressured, s.TimedOut)
	}
	for p := range m.partitions {
		earliest, end, _ := m.topic.Offsets(p)
		if end-earliest > int64(m.retention.MaxMessages) {
			t.Fatalf("retention: partition %d holds %d records, more than %d", p, end-earliest, m.retention.MaxMessages)
		}
	}
}

// closeAndCheck is invariant 10. Close, called from several goroutines at
// once, drains what can drain, stops everything (the bubble fails the test
// if a goroutine is left), reports exactly the partitions left behind, and
// afterwards every operation fails with ErrClosed.
func (m *machine) closeAndCheck(t *rapid.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = m.b.Close(ctx) })
	}
	wg.Wait()
	for _, err := range errs[1:] {
		if err != errs[0] {
			t.Fatalf("close: concurrent Close calls returned %v and %v", errs[0], err)
		}
	}
	if s := m.b.State(); s != pubsub.Stopped {
		t.Fatalf("close: state %v after Close", s)
	}

	var want []pubsub.Unfinished
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		for p := range m.partitions {
			_, end, _ := m.topic.Offsets(p)
			if c := m.groups[group].Committed(p); c < end {
				want = append(want, pubsub.Unfinished{Group: group, Topic: "jobs", Partition: p, Committed: c, End: end})
			}
		}
	}
	se, isShutdown := errors.AsType[*pubsub.ShutdownError](errs[0])
	switch {
	case want == nil && errs[0] != nil:
		t.Fatalf("close: nothing was left but Close returned %v", errs[0])
	case want != nil && (!isShutdown || !slices.Equal(se.Unfinished, want)):
		t.Fatalf("close: returned %v, want a ShutdownError listing %+v", errs[0], want)
	}
	for _, u := range want {
		if len(m.members[u.Group]) > 0 && !m.paused[u.Group] {
			t.Fatalf("close: active group %s left partition %d at %d of %d", u.Group, u.Partition, u.Committed, u.End)
		}
	}
	m.Check(t) // every ack that returned before Close is in the committed offsets

	if _, err := m.topic.PublishValue(context.Background(), job{}); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Publish after Close returned %v, want ErrClosed", err)
	}
	if _, err := m.topic.Subscribe("late", "c0", m.handler("late", "c0")); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Subscribe after Close returned %v, want ErrClosed", err)
	}
}
