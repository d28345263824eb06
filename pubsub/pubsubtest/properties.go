package pubsubtest

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
// in virtual time, exactly and instantly. The broker's clock is the
// bubble's, read exactly (bubbleClock), so the model knows every record's
// Created and can tell where AtTime starts.
//
// Consumers come in two kinds. Handlers act out the fault their record
// carries. Streams are driven by the actions: a delivery is received (or
// left unread on the channel while other actions run), held across
// actions, acked or nacked, or given back by closing the stream. Groups
// start where a drawn Start says.
//
// Everything observable is appended to a history: publish results,
// deliveries with their outcome and epoch, dead letters, seeks. The
// invariants are checked over that history after every action, after every
// drain, and after Close. Each check is named for the invariant it guards,
// and its failure message shows the offending events.
//
// Vocabulary: an epoch of a (group, partition) is the span between two
// repositionings of its cursor: the group's creation at its Start, a Seek,
// a Replay. Within an epoch the cursor only moves forward. A delivery is a
// handler call, or a Stream delivery that a consumer received: it begins
// then, and ends with an outcome (see outcome). A Stream delivery waiting
// on the channel that nobody received is not one: when the group takes it
// back, nothing happened, and no attempt was counted.
//
// Timing: every wait in a run lasts whole milliseconds of virtual time
// (handlers, backoffs, BlockTimeouts, Advance, control-call deadlines), so
// all of it happens at whole milliseconds; only the final Close's deadline
// is half a millisecond off. So whether a handler ended before Close gave
// up, or before Close returned, is never a tie the scheduler decides.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

// RunProperties runs the property suite on e: rapid drives a state machine
// of publishes (single, bursts from concurrent producers, batches), joins of
// handlers, batch consumers and Streams at drawn start positions, leaves,
// pauses, seeks, replays, faults (transient, permanent, panics, undecodable
// records, handlers that outlast Close) and virtual time, against one
// broker and one topic whose shape is drawn per run, and checks after every
// step the invariants this file's comment lists. A failure is shrunk to a
// short sequence of actions and saved for replay, as rapid does; the number
// of runs is rapid's (100, or -rapid.checks, or RAPID_CHECKS).
//
// The model predicts every record's fate exactly (which record Block
// refuses, DropOldest evicts or MaxAge trims, what each attempt counts), so
// it needs an engine that keeps every promise: e must declare every
// Capability of AllCapabilities, Synctest included, or RunProperties skips,
// naming what is missing. Each run builds its broker with e.NewBroker inside
// its own testing/synctest bubble, with the suite's options (a retry
// policy, WithClock, and in half the runs WithHooks, WithLogger and
// WithStuckAfter); the tb it passes routes cleanups and failures to the run.
func RunProperties(t *testing.T, e Engine) {
	t.Helper()
	if e.NewBroker == nil {
		t.Fatalf("pubsubtest: engine %q: NewBroker is nil", e.Name)
	}
	var missing []string
	for _, c := range AllCapabilities() {
		if !slices.Contains(e.Capabilities, c) {
			missing = append(missing, string(c))
		}
	}
	if len(missing) > 0 {
		t.Skipf("pubsubtest: engine %q lacks %s: the property model predicts what only an engine with every capability does",
			e.Name, strings.Join(missing, ", "))
	}
	rapid.Check(t, func(rt *rapid.T) {
		rapid.SyncTest(rt, func(rt *rapid.T) {
			m := newMachine(rt, e, runTB{TB: t, run: rt})
			defer m.stop(rt) // inside the bubble, where the broker lives
			// Two rounds of actions (twice -rapid.steps on average): a
			// control call meets a held Stream delivery only after a join,
			// a publish and a receive, and the second round doubles how
			// often that happens, for about twice the time.
			actions := rapid.StateMachineActions(m)
			rt.Repeat(actions)
			rt.Repeat(actions)
			m.closeAndCheck(rt)
		})
	})
}

// runTB is the testing.TB that RunProperties hands to Engine.NewBroker:
// cleanups, logs and failures go to the rapid run (whose cleanups run at
// the end of the run, inside its bubble), the rest to the test.
type runTB struct {
	testing.TB
	run *rapid.T
}

func (tb runTB) Cleanup(f func())                  { tb.run.Cleanup(f) }
func (tb runTB) Helper()                           { tb.run.Helper() }
func (tb runTB) Log(args ...any)                   { tb.run.Log(args...) }
func (tb runTB) Logf(format string, args ...any)   { tb.run.Logf(format, args...) }
func (tb runTB) Error(args ...any)                 { tb.run.Error(args...) }
func (tb runTB) Errorf(format string, args ...any) { tb.run.Errorf(format, args...) }
func (tb runTB) Fatal(args ...any)                 { tb.run.Fatal(args...) }
func (tb runTB) Fatalf(format string, args ...any) { tb.run.Fatalf(format, args...) }
func (tb runTB) Fail()                             { tb.run.Fail() }
func (tb runTB) FailNow()                          { tb.run.FailNow() }
func (tb runTB) Failed() bool                      { return tb.run.Failed() }
func (tb runTB) Skip(args ...any)                  { tb.run.Skip(args...) }
func (tb runTB) Skipf(format string, args ...any)  { tb.run.Skipf(format, args...) }
func (tb runTB) SkipNow()                          { tb.run.SkipNow() }

// A job is the value every record carries: its sequence number, and the
// fault its handlers must act out. The fault travels in the record, so every
// group and every redelivery acts it out the same way.
type job struct {
	Seq   int
	Fault fault
	K     int // for transient: the attempts that fail, per epoch
	// Sleep is how long the handler takes, in milliseconds of virtual time,
	// ignoring its context: a window for overlaps, and for rebalances,
	// control calls and Close to meet a delivery in flight. 30ms outlasts
	// Close's 10ms grace: the handler is still running when Close returns.
	Sleep int
}

type fault int

const (
	faultNone        fault = iota
	faultTransient         // fails its first K attempts, then acks
	faultPermanent         // fails wrapping ErrPermanent: dead-lettered after 1 attempt
	faultPanic             // panics on every attempt (a stream nacks it with nil): dead-lettered after MaxAttempts
	faultUndecodable       // its bytes fail to decode: dead-lettered, never delivered
)

var errUndecodable = errors.New("undecodable job")

var jobCodec = codec.Func(
	func(j job) ([]byte, error) { return fmt.Appendf(nil, "%d|%d|%d|%d", j.Seq, j.Fault, j.K, j.Sleep), nil },
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
		j.Sleep, errs[3] = strconv.Atoi(parts[3])
		j.Fault = fault(f)
		if err := errors.Join(errs[:]...); err != nil || j.Fault == faultUndecodable {
			return job{}, fmt.Errorf("job %q: %w", b, errUndecodable)
		}
		return j, nil
	},
)

// nackError is the error of every failure the suite chooses: a handler's
// transient or permanent fault, a Stream's Nack. A dead letter's Err must
// be the one its last attempt failed with.
type nackError struct {
	seq, attempt int
	permanent    bool
}

func (e *nackError) Error() string {
	if e.permanent {
		return fmt.Sprintf("seq %d attempt %d: permanent failure", e.seq, e.attempt)
	}
	return fmt.Sprintf("seq %d attempt %d: transient failure", e.seq, e.attempt)
}

func (e *nackError) Unwrap() error {
	if e.permanent {
		return pubsub.ErrPermanent
	}
	return nil
}

// bubbleClock is the broker's clock: the bubble's virtual time, read
// exactly. The default clock reads time.Now once per millisecond, so a
// record's Created may be a millisecond early, and the model could not
// tell where AtTime starts. Age retention measures with time.Now either
// way, so it behaves as with the default clock.
type bubbleClock struct{}

func (bubbleClock) Now() time.Time { return time.Now() }

// closeGrace is how long Close waits for handlers after its context ended
// (see Broker.Close).
const closeGrace = 10 * time.Millisecond

// settleTime outlasts any handler call (30ms): a control call given it
// while the test holds a Stream delivery returns when it expires, and by
// then every delivery of the group but the held ones has ended.
const settleTime = 40 * time.Millisecond

type gp struct {
	group     string
	partition int
}

type gpEpoch struct {
	gp
	epoch int
}

// outcome is how a delivery ended.
type outcome int

const (
	acked     outcome = iota
	failed            // an error, a panic or a Nack: a failed attempt, retried or dead-lettered
	givenBack         // a received Stream delivery given back unsettled (Stream.Close, Close): no failure, but it was an attempt
	cut               // failed after Close gave up draining: the worker drops it
)

func (o outcome) String() string { return [...]string{"ack", "fail", "given back", "cut"}[o] }

// call is one delivery: a handler call or a received Stream delivery.
type call struct {
	group, consumer string
	stream          bool
	partition       int
	offset          int64
	attempt         int
	seq             int
	epoch           int
	created         time.Time // the Message's Created
	outcome         outcome
	// kind, for a failure, is what its dead letter's Err is, should it be
	// the record's last attempt: transient, permanent (a *nackError),
	// panic (a *PanicError), nacked (Nack(nil)).
	kind string
	end  time.Time // when the outcome was given, in virtual time
}

func (c call) String() string {
	via := "handler"
	if c.stream {
		via = "stream"
	}
	return fmt.Sprintf("%s/%s (%s) p%d@%d seq %d attempt %d epoch %d: %v",
		c.group, c.consumer, via, c.partition, c.offset, c.seq, c.attempt, c.epoch, c.outcome)
}

// letter is what the model knows of a dead letter.
type letter struct {
	partition int
	offset    int64
	attempts  int
	kind      string // decode, or a call's kind
}

// published is the model's record of one successful publish.
type published struct {
	job       job
	key       string
	partition int
	offset    int64
	created   time.Time // the virtual time of the publish call
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

// startSpec is a drawn Start, as the model resolves it.
type startSpec struct {
	kind   string // "" (no StartAt option), earliest, latest, offset, time
	offset int64
	at     time.Time
}

func (s startSpec) start() pubsub.Start {
	switch s.kind {
	case "latest":
		return pubsub.Latest()
	case "offset":
		return pubsub.AtOffset(s.offset)
	case "time":
		return pubsub.AtTime(s.at)
	}
	return pubsub.Earliest()
}

func (s startSpec) options() []pubsub.SubscribeOption {
	opts := []pubsub.SubscribeOption{pubsub.WithDeadLetterLimit(1 << 20)}
	if s.kind != "" {
		opts = append(opts, pubsub.StartAt(s.start()))
	}
	return opts
}

// same reports whether groups created with s and o are configured alike:
// no StartAt is StartAt(Earliest()).
func (s startSpec) same(o startSpec) bool {
	norm := func(x startSpec) startSpec {
		if x.kind == "" {
			x.kind = "earliest"
		}
		return x
	}
	s, o = norm(s), norm(o)
	return s.kind == o.kind && s.offset == o.offset && s.at.Equal(o.at)
}

func (s startSpec) String() string {
	if s.kind == "" {
		return "no StartAt"
	}
	return s.start().String()
}

// holder is who has a delivery of a (group, partition) in hand.
type holder struct {
	consumer string
	stream   bool
}

// streamModel is one Stream the suite opened.
type streamModel struct {
	group, consumer string
	s               *pubsub.Stream[job]
	g               *pubsub.Group[job]
	left            bool        // no longer a member: Group.Leave or Stream.Close removed it
	closed          bool        // Stream.Close was called
	held            []*delivery // guarded by machine.mu: received, not yet settled or given back
}

// delivery is a Stream delivery the suite received and holds.
type delivery struct {
	st    *streamModel
	d     *pubsub.Delivery[job]
	epoch int
}

type machine struct {
	b           *pubsub.Broker
	topic       *pubsub.Topic[string, job]
	partitions  int
	retention   pubsub.Retention
	maxAttempts int

	keys      []string
	joinBatch []pubsub.SubscribeOption // set while SubscribeBatch joins: its batch options
	groups    map[string]*pubsub.Group[job]
	starts    map[string]startSpec // what each group was created with
	members   map[string][]string  // the model's membership, in join order
	streams   []*streamModel       // every stream opened, in order
	nextSeq   int
	bySeq     map[int]published
	failedSeq map[int]error
	byPos     map[pubsub.Position]int // where each seq landed

	backpressured int64
	// droppedGroupless is what the topic had dropped when the first group
	// subscribed: under Block, a full partition no group reads drops its
	// oldest record, and only then.
	droppedGroupless int64

	mu         sync.Mutex // guards the fields below: handlers and pumps write them
	calls      []call
	busy       map[gp]holder   // the deliveries begun and not ended
	paused     map[string]bool // written under mu; the test goroutine, the only writer, reads it without
	epochIdx   map[gp]int
	violations []string
	spent      []*pubsub.Delivery[job] // settled or given back: Ack and Nack must do nothing now
	closedAt   time.Time               // when Close returned: a handler that ends later commits nothing

	epochs        map[gp][]*epoch
	lastCommitted map[gp]int64
	seenCalls     int                       // calls already folded into epochs
	seenDead      map[string]int            // dead letters already folded, per group
	lastCall      map[gpEpoch]call          // the latest call of each epoch of each (group, partition)
	wantLetters   map[string]map[letter]int // the dead letters the history explains, per group
	retried       map[string]int64          // failed attempts that were not the last, per group
	lateAcks      map[string]int64          // acks given after Close returned, per group

	tally *tally // the hooks' counts, when the run is observed
}

func newMachine(t *rapid.T, e Engine, tb testing.TB) *machine {
	m := &machine{
		partitions:  rapid.IntRange(1, 8).Draw(t, "partitions"),
		maxAttempts: rapid.IntRange(1, 4).Draw(t, "maxAttempts"),
		keys:        rapid.SampledFrom([][]string{{"a"}, {"a", "b"}, {"a", "b", "c", "d", "e"}}).Draw(t, "keys"),
		groups:      map[string]*pubsub.Group[job]{},
		starts:      map[string]startSpec{},
		members:     map[string][]string{},
		bySeq:       map[int]published{},
		failedSeq:   map[int]error{},
		byPos:       map[pubsub.Position]int{},
		busy:        map[gp]holder{},
		paused:      map[string]bool{},
		epochIdx:    map[gp]int{},
		epochs:      map[gp][]*epoch{},
		seenDead:    map[string]int{},
		lastCall:    map[gpEpoch]call{},
		wantLetters: map[string]map[letter]int{},
		retried:     map[string]int64{},
		lateAcks:    map[string]int64{},

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
	opts := []pubsub.BrokerOption{pubsub.WithRetry(retry), pubsub.WithClock(bubbleClock{})}
	if rapid.Bool().Draw(t, "observed") {
		// Every hook, a logger that formats every record, and the stuck
		// watchdog: the run must keep every invariant all the same, and
		// the hooks' tallies must match the counters (checkTally).
		m.tally = &tally{}
		opts = append(opts, pubsub.WithHooks(m.tally), pubsub.WithLogger(slog.New(slog.NewTextHandler(io.Discard,
			&slog.HandlerOptions{Level: slog.LevelDebug}))), pubsub.WithStuckAfter(time.Second))
	}
	// stop closes it, deferred in the bubble's body; the cleanup that
	// e.NewBroker registers finds it closed.
	m.b = e.NewBroker(tb, opts...)
	var err error
	m.topic, err = pubsub.NewTopic(m.b, "jobs", codec.String(), jobCodec,
		pubsub.WithPartitions(m.partitions), pubsub.WithRetention(m.retention))
	if err != nil {
		t.Fatalf("NewTopic: %v", err)
	}
	return m
}

// stop ends every run, inside the bubble: after closeAndCheck it finds the
// broker stopped; after a failure it closes the broker, bounded (virtual
// time), so the bubble ends with no goroutine of the broker's or the
// suite's left, and rapid, not the bubble, reports the failure and shrinks
// it. Goroutines that outlive Close fail the run here, with t.Fatalf,
// rather than the bubble's "blocked goroutines remain" after it.
func (m *machine) stop(t *rapid.T) {
	failure := recover()
	if m.b.State() != pubsub.Stopped {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		err := m.b.Close(ctx)
		cancel()
		if failure != nil && err != nil {
			t.Logf("closing the broker after the failure: %v", err)
		}
	}
	time.Sleep(time.Second) // virtual: a handler that outlived Close ends
	synctest.Wait()
	left := bubbleLeftovers()
	for _, g := range left {
		t.Logf("left behind:\n%s", g)
	}
	if failure != nil {
		if len(left) > 0 {
			// The bubble will report the goroutines left in place of the
			// failure: say what it was.
			t.Logf("the run ended with: %v", failure)
		}
		panic(failure) // the run's own failure, for rapid
	}
	if len(left) > 0 {
		t.Fatalf("close: %d goroutines outlived the broker", len(left))
	}
}

// bubbleLeftovers returns the stacks of the goroutines of the calling
// goroutine's synctest bubble that the broker or the suite started and
// that still exist, found in the runtime's goroutine dump, whose headers
// name the bubble ("[chan receive (durable), synctest bubble 3]:").
// Goroutines that the testing packages run the bubble with are not
// counted.
func bubbleLeftovers() []string {
	bubbleOf := func(header string) string {
		_, after, ok := strings.Cut(header, "synctest bubble ")
		if !ok {
			return ""
		}
		return strings.TrimRightFunc(after, func(r rune) bool { return r < '0' || r > '9' })
	}
	self := make([]byte, 4096)
	self = self[:runtime.Stack(self, false)]
	selfHeader, _, _ := strings.Cut(string(self), "\n")
	bubble := bubbleOf(selfHeader)
	if bubble == "" {
		return nil
	}
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var left []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if header == selfHeader || bubbleOf(header) != bubble {
			continue
		}
		_, creator, _ := strings.Cut(g, "\ncreated by ")
		if strings.HasPrefix(creator, "testing.") || strings.HasPrefix(creator, "testing/synctest.") ||
			strings.HasPrefix(creator, "pgregory.net/rapid") {
			continue
		}
		left = append(left, g)
	}
	return left
}

// ---- publishing ----

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
	j.Sleep = rapid.SampledFrom([]int{0, 0, 0, 0, 0, 0, 0, 0, 10, 30}).Draw(t, "sleep")
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
	now := time.Now() // the record's Created: nothing in the bubble moves time before Publish reads the clock
	pos, err := m.publish(key, j)
	m.recordPublish(t, []publishResult{{key: key, job: j, pos: pos, err: err, created: now}})
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
				now := time.Now() // a blocked publish before this one moved time on
				pos, err := m.publish(pl.key, pl.job)
				results[p] = append(results[p], publishResult{key: pl.key, job: pl.job, pos: pos, err: err, created: now})
			}
		})
	}
	wg.Wait()
	m.recordPublish(t, slices.Concat(results...))
}

type publishResult struct {
	key     string
	job     job
	pos     pubsub.Position
	err     error
	created time.Time
	// unattempted marks the entries of a batch after the one that failed:
	// not published, and not a failed publish of their own.
	unattempted bool
}

// PublishBatch publishes a batch in one call: keyed entries with
// PublishBatch, or keyless ones with PublishValues. The positions it
// returns are checked like single publishes' (density, routing); the
// entries after a failure are not in the log. A batch reads the clock
// once: its records share one Created.
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
	now := time.Now()
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
		results[i] = publishResult{key: e.Key, job: e.Value, created: now}
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
		m.bySeq[r.job.Seq] = published{job: r.job, key: r.key, partition: r.pos.Partition, offset: r.pos.Offset, created: r.created}
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

// ---- groups ----

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

// drawStart draws a Start: none (withNone), Earliest, Latest, AtOffset
// around the offsets in use, or AtTime at, just before or just after the
// Created of a record published so far, or long before or after all.
func (m *machine) drawStart(t *rapid.T, label string, withNone bool) startSpec {
	kinds := []string{"earliest", "latest", "offset", "offset", "time", "time"}
	if withNone {
		kinds = append([]string{"", "", ""}, kinds...)
	}
	s := startSpec{kind: rapid.SampledFrom(kinds).Draw(t, label)}
	switch s.kind {
	case "offset":
		s.offset = rapid.Int64Range(0, 12).Draw(t, label+"Offset")
	case "time":
		times := []time.Time{time.Now().Add(-time.Hour), time.Now().Add(time.Second)}
		for _, seq := range slices.Sorted(maps.Keys(m.bySeq)) {
			times = append(times, m.bySeq[seq].created)
		}
		at := rapid.SampledFrom(times).Draw(t, label+"Time")
		s.at = at.Add(rapid.SampledFrom([]time.Duration{-1, 0, 0, 1}).Draw(t, label+"Nudge"))
	}
	return s
}

// resolve is where s starts in partition p as the model sees it: within
// the retained range, for AtTime the first retained record whose Created
// is not before s's time, in offset order (Created need not grow with the
// offset: a blocked publish reads the clock before it waits).
func (m *machine) resolve(s startSpec, p int) int64 {
	earliest, end, _ := m.topic.Offsets(p)
	switch s.kind {
	case "latest":
		return end
	case "offset":
		return min(max(s.offset, earliest), end)
	case "time":
		for o := earliest; o < end; o++ {
			if !m.bySeq[m.byPos[pubsub.Position{Partition: p, Offset: o}]].created.Before(s.at) {
				return o
			}
		}
		return end
	}
	return earliest
}

// Subscribe adds a handler consumer to a group.
func (m *machine) Subscribe(t *rapid.T) { m.join(t, false) }

// Stream adds a Stream consumer to a group.
func (m *machine) Stream(t *rapid.T) { m.join(t, true) }

// SubscribeBatch adds a batch consumer (see batchHandler) to a group, with
// a drawn batch size and wait.
func (m *machine) SubscribeBatch(t *rapid.T) {
	m.joinBatch = []pubsub.SubscribeOption{
		pubsub.WithBatchSize(rapid.SampledFrom([]int{1, 2, 3, 8}).Draw(t, "batchSize")),
		pubsub.WithBatchWait(time.Duration(rapid.SampledFrom([]int{0, 0, 3}).Draw(t, "batchWaitMs")) * time.Millisecond),
	}
	defer func() { m.joinBatch = nil }()
	m.join(t, false)
}

// join adds a consumer. A new group is created with a drawn Start, and its
// first epoch begins, in every partition, where that Start resolves
// against the retained range now: nothing runs between the model reading
// the range and Subscribe creating the group. Joining an existing group
// sometimes gives other options than it was created with: that, like a
// consumer already in the group, must fail with ErrSubscription and change
// nothing.
func (m *machine) join(t *rapid.T, stream bool) {
	group := m.drawGroup(t)
	consumer := rapid.SampledFrom([]string{"c0", "c1", "c2", "c3"}).Draw(t, "consumer")
	prev, exists := m.groups[group]
	spec := m.starts[group]
	if !exists {
		spec = m.drawStart(t, "start", true)
	} else if rapid.IntRange(0, 5).Draw(t, "otherOptions") == 0 {
		spec = m.drawStart(t, "otherStart", true)
	}
	refused := slices.Contains(m.members[group], consumer) || exists && !spec.same(m.starts[group])
	if !exists && len(m.groups) == 0 {
		m.droppedGroupless = m.topic.Stats().Dropped
	}
	if !exists {
		m.mu.Lock()
		for p := range m.partitions {
			start := m.resolve(spec, p)
			m.epochs[gp{group, p}] = []*epoch{newEpoch(start)}
			m.lastCommitted[gp{group, p}] = start
		}
		m.mu.Unlock()
	}
	var g *pubsub.Group[job]
	var s *pubsub.Stream[job]
	var err error
	if stream {
		if s, err = m.topic.Stream(group, consumer, spec.options()...); err == nil {
			g = s.Group()
		}
	} else if m.joinBatch != nil {
		g, err = m.topic.SubscribeBatch(group, consumer, m.batchHandler(group, consumer), append(spec.options(), m.joinBatch...)...)
	} else {
		g, err = m.topic.Subscribe(group, consumer, m.handler(group, consumer), spec.options()...)
	}
	if refused {
		if !errors.Is(err, pubsub.ErrSubscription) {
			t.Fatalf("subscribing %s to %s (%v; members %v, created with %v): got %v, want ErrSubscription",
				consumer, group, spec, m.members[group], m.starts[group], err)
		}
		m.checkAssignment(t, group)
		return
	}
	if err != nil {
		t.Fatalf("join %s to %s (%v): %v", consumer, group, spec, err)
	}
	if exists && prev != g {
		t.Fatalf("Subscribe returned a second *Group for %s", group)
	}
	if !exists {
		m.starts[group] = spec
	}
	m.groups[group] = g
	m.members[group] = append(m.members[group], consumer)
	if stream {
		m.streams = append(m.streams, &streamModel{group: group, consumer: consumer, s: s, g: g})
	}
	m.checkAssignment(t, group)
}

// memberStream returns the stream that is consumer of group now, or nil.
func (m *machine) memberStream(group, consumer string) *streamModel {
	for _, st := range m.streams {
		if !st.left && st.group == group && st.consumer == consumer {
			return st
		}
	}
	return nil
}

// Leave removes a member. A stream that holds deliveries makes Leave wait
// until its context ends: it gets a short one, and must report the
// deadline and have left all the same; its held deliveries stay valid.
func (m *machine) Leave(t *rapid.T) {
	group, g := m.existingGroup(t)
	if len(m.members[group]) == 0 {
		t.Skip("no members")
	}
	consumer := rapid.SampledFrom(m.members[group]).Draw(t, "consumer")
	st := m.memberStream(group, consumer)
	holding := st != nil && len(m.heldBy(st)) > 0
	ctx, cancel := m.controlCtx(t, holding)
	defer cancel()
	err := g.Leave(ctx, consumer)
	switch {
	case holding && !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("Leave(%s, %s) holding deliveries: got %v, want DeadlineExceeded", group, consumer, err)
	case !holding && err != nil:
		t.Fatalf("Leave(%s, %s): %v", group, consumer, err)
	}
	m.members[group] = slices.DeleteFunc(m.members[group], func(c string) bool { return c == consumer })
	if st != nil {
		st.left = true
	}
	m.checkAssignment(t, group)
}

// checkAssignment: every partition has exactly one owner among the members
// (invariant 4's static half), and shares differ by at most one.
func (m *machine) checkAssignment(t *rapid.T, group string) {
	g, ok := m.groups[group]
	if !ok {
		return
	}
	a := g.Assignment()
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

// controlCtx is the context of a control call: none that ends, unless the
// call must wait for a Stream delivery the test holds, which only ends
// with the context; then a short deadline (virtual), 0 being one passed
// already.
func (m *machine) controlCtx(t *rapid.T, short bool) (context.Context, context.CancelFunc) {
	if !short {
		return context.WithCancel(context.Background())
	}
	d := rapid.SampledFrom([]time.Duration{0, time.Millisecond, settleTime}).Draw(t, "deadline")
	return context.WithTimeout(context.Background(), d)
}

func (m *machine) setPaused(group string, paused bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.paused[group] = paused
}

// Pause pauses a group. While a delivery of it is held, Pause waits for it
// until its context ends, and then must say so and have paused anyway: no
// delivery begins from then on (see beginLocked).
func (m *machine) Pause(t *rapid.T) {
	group, g := m.existingGroup(t)
	holding := len(m.held(group)) > 0
	ctx, cancel := m.controlCtx(t, holding)
	defer cancel()
	err := g.Pause(ctx)
	switch {
	case holding && !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("Pause(%s) with a held delivery: got %v, want DeadlineExceeded", group, err)
	case !holding && err != nil:
		t.Fatalf("Pause(%s): %v", group, err)
	}
	m.setPaused(group, true)
}

func (m *machine) Resume(t *rapid.T) {
	group, g := m.existingGroup(t)
	m.setPaused(group, false)
	if err := g.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Seek repositions one partition. While a delivery of that partition is
// held, Seek waits for it until its context ends, and then must say so
// and have moved nothing.
func (m *machine) Seek(t *rapid.T) {
	group, g := m.existingGroup(t)
	p := rapid.IntRange(0, m.partitions-1).Draw(t, "partition")
	if held := m.held(group); len(held) > 0 && rapid.Bool().Draw(t, "seekHeld") {
		p = held[rapid.IntRange(0, len(held)-1).Draw(t, "heldPartition")].d.Partition
	}
	defer m.quiesce(t, group, g)()
	earliest, end, _ := m.topic.Offsets(p)
	offset := rapid.Int64Range(max(0, earliest-1), end+1).Draw(t, "offset")
	valid := offset >= earliest && offset <= end
	if valid && m.heldOn(group, p) {
		before := g.Committed(p)
		ctx, cancel := m.controlCtx(t, true)
		defer cancel()
		err := g.Seek(ctx, p, offset)
		if !errors.Is(err, context.DeadlineExceeded) || g.Committed(p) != before {
			t.Fatalf("Seek(%s, %d, %d) with a held delivery: got %v and committed %d (was %d); want DeadlineExceeded and nothing moved",
				group, p, offset, err, g.Committed(p), before)
		}
		return
	}
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

// Replay repositions every partition of a group to a drawn Start, through
// the Group or the Broker. While a delivery of the group is held, Replay
// waits for it until its context ends, and then must say so and have
// moved nothing; a negative offset is ErrInvalid and moves nothing either.
func (m *machine) Replay(t *rapid.T) {
	group, g := m.existingGroup(t)
	defer m.quiesce(t, group, g)()
	from := m.drawStart(t, "from", false)
	negative := rapid.IntRange(0, 15).Draw(t, "negative") == 0
	viaBroker := rapid.Bool().Draw(t, "viaBroker")
	replay := func(ctx context.Context, s pubsub.Start) error {
		if viaBroker {
			return m.b.Replay(ctx, group, "jobs", s)
		}
		return g.Replay(ctx, s)
	}
	stops := make([]int64, m.partitions) // where the old epochs end: the group is paused, so nothing commits
	for p := range m.partitions {
		stops[p] = g.Committed(p)
	}
	movedNothing := func(what string, err error) {
		for p := range m.partitions {
			if c := g.Committed(p); c != stops[p] {
				t.Fatalf("Replay(%s) %s: got %v, and partition %d moved from %d to %d", group, what, err, p, stops[p], c)
			}
		}
	}
	switch {
	case negative:
		err := replay(context.Background(), pubsub.AtOffset(-1))
		if !errors.Is(err, pubsub.ErrInvalid) {
			t.Fatalf("Replay(%s, AtOffset(-1)): got %v, want ErrInvalid", group, err)
		}
		movedNothing("from a negative offset", err)
		return
	case len(m.held(group)) > 0:
		ctx, cancel := m.controlCtx(t, true)
		defer cancel()
		err := replay(ctx, from.start())
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Replay(%s, %v) with a held delivery: got %v, want DeadlineExceeded", group, from, err)
		}
		movedNothing("with a held delivery", err)
		return
	}
	asked := make([]int64, m.partitions) // where each partition should go, as the model sees it now
	for p := range m.partitions {
		asked[p] = m.resolve(from, p)
	}
	if err := replay(context.Background(), from.start()); err != nil {
		t.Fatalf("Replay(%s, %v): %v", group, from, err)
	}
	// The group is paused, so its cursors are where the replay put them.
	// That can be past what the model asked for: seeking one partition
	// wakes the producers blocked on it, and their next appends, to
	// partitions not sought yet, can trim records that aged out.
	for p := range m.partitions {
		start := g.Committed(p)
		if earliest, _, _ := m.topic.Offsets(p); start < asked[p] || start > max(asked[p], earliest) {
			t.Fatalf("Replay(%s, %v): partition %d at %d, want %d or, if retention trimmed meanwhile, up to %d",
				group, from, p, start, asked[p], earliest)
		}
		m.newEpoch(group, p, stops[p], start)
	}
}

// quiesce pauses group and waits until every goroutine of the bubble is
// blocked; the function it returns resumes the group, unless it was
// paused before. The model of a seek reads the retained range and the
// committed offset before the call: that is exact only if nothing moves
// them during the call. A running group's seek waits for its deliveries in
// flight, and while it waits virtual time can pass, age retention can
// trim, and the seek then clamps to an earliest offset the model never
// saw (found by this suite: a replay that started past records nobody
// counted as skipped). Paused and quiet, the group's seek waits for
// nothing, so no time passes and nothing else runs until it is done.
//
// A paused group may still have deliveries in flight (a Pause whose
// context ended), so quiesce pauses it again all the same. While the test
// holds a delivery of the group, Pause waits for it until its context
// ends: it gets settleTime, by when every other delivery ended.
func (m *machine) quiesce(t *rapid.T, group string, g *pubsub.Group[job]) (resume func()) {
	wasPaused := m.paused[group]
	holding := len(m.held(group)) > 0
	ctx, cancel := context.WithCancel(context.Background())
	if holding {
		ctx, cancel = context.WithTimeout(context.Background(), settleTime)
	}
	defer cancel()
	err := g.Pause(ctx)
	switch {
	case holding && !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("Pause(%s) with a held delivery: got %v, want DeadlineExceeded", group, err)
	case !holding && err != nil:
		t.Fatalf("Pause(%s): %v", group, err)
	}
	m.setPaused(group, true)
	synctest.Wait()
	if wasPaused {
		return func() {}
	}
	return func() {
		m.setPaused(group, false)
		_ = g.Resume(context.Background())
	}
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

// Drain waits for every group to catch up, the member streams consuming as
// handlers would (see pump), then checks that it did (invariant 5); or,
// when a group with lag cannot move (paused, or without members), checks
// that Drain said so at once, naming each such group. A delivery the test
// holds is lag Drain can only wait out: then it gets a short deadline and
// must say what was left.
func (m *machine) Drain(t *rapid.T) {
	holding := m.held("")
	timeout := time.Hour
	if len(holding) > 0 {
		timeout = time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stopPumps := m.pump()
	defer stopPumps()
	start := time.Now()
	err := m.b.Drain(ctx)
	took := time.Since(start)
	stopPumps()
	var stalled []string
	for group, g := range m.groups {
		if (len(m.members[group]) == 0 || m.paused[group]) && g.Lag() > 0 {
			stalled = append(stalled, group)
		}
	}
	if len(stalled) > 0 {
		if !errors.Is(err, pubsub.ErrStalled) || took != 0 {
			t.Fatalf("Drain with stalled groups %v: got %v after %v, want ErrStalled at once", stalled, err, took)
		}
		for _, group := range stalled {
			if !strings.Contains(err.Error(), fmt.Sprintf("group %q", group)) {
				t.Fatalf("Drain: %v does not name the stalled group %s", err, group)
			}
		}
		return
	}
	if len(holding) > 0 {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Drain with held deliveries: got %v, want DeadlineExceeded", err)
		}
		for _, d := range holding {
			if !strings.Contains(err.Error(), fmt.Sprintf("group %q", d.st.group)) {
				t.Fatalf("Drain: %v does not name %s, whose delivery is held", err, d.st.group)
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

// ---- streams ----

// drawStream draws one of the streams that ok accepts.
func (m *machine) drawStream(t *rapid.T, ok func(*streamModel) bool) *streamModel {
	var candidates []*streamModel
	for _, st := range m.streams {
		if ok(st) {
			candidates = append(candidates, st)
		}
	}
	if len(candidates) == 0 {
		t.Skip("no such stream")
	}
	return candidates[rapid.IntRange(0, len(candidates)-1).Draw(t, "stream")]
}

// held returns the deliveries the test holds, of group or, for "", of
// every group, in the order the streams opened.
func (m *machine) held(group string) []*delivery {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*delivery
	for _, st := range m.streams {
		if group == "" || st.group == group {
			out = append(out, st.held...)
		}
	}
	return out
}

func (m *machine) heldBy(st *streamModel) []*delivery {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(st.held)
}

func (m *machine) heldOn(group string, p int) bool {
	return slices.ContainsFunc(m.held(group), func(d *delivery) bool { return d.d.Partition == p })
}

// settlement is what the test does with a delivery it received.
type settlement int

const (
	hold settlement = iota
	settleAck
	settleNack          // a transient *nackError
	settleNackPermanent // a *nackError wrapping ErrPermanent
	settleNackNil       // Nack(nil)
)

func (m *machine) drawSettlement(t *rapid.T, mayHold bool) settlement {
	choices := []settlement{settleAck, settleAck, settleNack, settleNackPermanent, settleNackNil}
	if mayHold {
		choices = append([]settlement{hold, hold, hold}, choices...)
	}
	return rapid.SampledFrom(choices).Draw(t, "settle")
}

// Receive takes what the streams offer now, without blocking: from each
// open stream in turn, starting at a drawn one, up to three deliveries,
// each held or settled at once (a settled one lets the next of its
// partition come). A stream offers a delivery, nothing, or, once it left
// its group and its last delivery ended, a closed channel. A stream that
// left must never receive anything.
func (m *machine) Receive(t *rapid.T) {
	var open []*streamModel
	for _, st := range m.streams {
		if !st.closed {
			open = append(open, st)
		}
	}
	if len(open) == 0 {
		t.Skip("no open stream")
	}
	first := rapid.IntRange(0, len(open)-1).Draw(t, "stream")
	received := 0
	for i := range open {
		st := open[(first+i)%len(open)]
		for received < 3 && m.receiveFrom(t, st) {
			received++
		}
	}
}

// receiveFrom takes what st offers now, and reports whether it was a
// delivery.
func (m *machine) receiveFrom(t *rapid.T, st *streamModel) bool {
	synctest.Wait() // every delivery on its way waits on the channel
	select {
	case d, ok := <-st.s.C():
		if !ok {
			switch {
			case !st.left:
				t.Fatalf("streams: C of %s/%s closed while it is a member", st.group, st.consumer)
			case len(m.heldBy(st)) > 0:
				t.Fatalf("streams: C of %s/%s closed while deliveries it received are held", st.group, st.consumer)
			}
			return false
		}
		h := m.receive(st, d)
		if how := m.drawSettlement(t, true); how != hold {
			m.settle(h, how)
		}
		return true
	default:
		if st.left && len(m.heldBy(st)) == 0 {
			t.Fatalf("streams: C of %s/%s still open after it left the group and its deliveries ended", st.group, st.consumer)
		}
		return false
	}
}

// Settle acks or nacks a held delivery; or, now and then, one settled or
// given back already, which must change nothing (every invariant would
// see a commit, a retry or a dead letter).
func (m *machine) Settle(t *rapid.T) {
	live := m.held("")
	m.mu.Lock()
	spent := slices.Clone(m.spent)
	m.mu.Unlock()
	if len(live) == 0 && len(spent) == 0 {
		t.Skip("nothing received")
	}
	if len(live) > 0 && (len(spent) == 0 || rapid.IntRange(0, 3).Draw(t, "again") > 0) {
		m.settle(live[rapid.IntRange(0, len(live)-1).Draw(t, "delivery")], m.drawSettlement(t, false))
		return
	}
	d := spent[rapid.IntRange(0, len(spent)-1).Draw(t, "spent")]
	if rapid.Bool().Draw(t, "ackAgain") {
		d.Ack()
	} else {
		d.Nack(&nackError{seq: d.Value.Seq, attempt: d.Attempt, permanent: true})
	}
}

// CloseStream closes a stream: its held deliveries are given back, to be
// delivered again with the attempt count going on; what it settled
// stands. Sometimes it first settles one delivery and closes at once, so
// that Close races the worker: a held delivery, whose worker waits for the
// outcome already; or one received just now, whose worker may still be on
// its way from handing it over to waiting for the outcome as Close lands.
// Either way the outcome must win.
func (m *machine) CloseStream(t *rapid.T) {
	st := m.drawStream(t, func(st *streamModel) bool { return !st.closed })
	before := rapid.SampledFrom([]string{"nothing", "settle held", "receive and settle"}).Draw(t, "beforeClose")
	held := m.heldBy(st)
	if before == "nothing" && len(held) == 0 && rapid.IntRange(0, 2).Draw(t, "closeIdle") > 0 {
		t.Skip("mostly, keep a stream that holds nothing open") // so that streams live long enough to hold things
	}
	switch {
	case before == "settle held" && len(held) > 0:
		m.settle(held[rapid.IntRange(0, len(held)-1).Draw(t, "delivery")], m.drawSettlement(t, false))
	case before == "receive and settle" && !st.left:
		select { // no synctest.Wait: the last Check waited
		case d, ok := <-st.s.C():
			if !ok {
				t.Fatalf("streams: C of %s/%s closed while it is a member", st.group, st.consumer)
			}
			m.settle(m.receive(st, d), m.drawSettlement(t, false))
		default:
		}
	}
	m.giveBack(st)
	err := st.s.Close()
	wasMember := !st.left
	st.closed, st.left = true, true
	switch {
	case wasMember && err != nil:
		t.Fatalf("Stream.Close of %s/%s: %v", st.group, st.consumer, err)
	case !wasMember && err != nil && !errors.Is(err, pubsub.ErrSubscription):
		t.Fatalf("Stream.Close of %s/%s, which had left: %v", st.group, st.consumer, err)
	}
	if wasMember {
		m.members[st.group] = slices.DeleteFunc(m.members[st.group], func(c string) bool { return c == st.consumer })
		select { // closed when Close returns
		case d, ok := <-st.s.C():
			if ok {
				t.Fatalf("streams: C of %s/%s delivered p%d@%d after Close", st.group, st.consumer, d.Partition, d.Offset)
			}
		default:
			t.Fatalf("streams: C of %s/%s open after Close returned", st.group, st.consumer)
		}
	}
	m.checkAssignment(t, st.group)
}

// pump consumes every member stream as a handler would, acting out the
// fault each record carries, until the function it returns is called or
// the channel closes: how Drain and Close can finish with streams in the
// groups.
func (m *machine) pump() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, st := range m.streams {
		if st.left {
			continue
		}
		wg.Go(func() { // exits when stop is called or C closes
			for {
				select {
				case <-done:
					return
				default:
				}
				select {
				case d, ok := <-st.s.C():
					if !ok {
						return
					}
					m.actOut(st, d)
				case <-done:
					return
				}
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

func (m *machine) actOut(st *streamModel, d *pubsub.Delivery[job]) {
	h := m.receive(st, d)
	how := settleAck
	switch d.Value.Fault {
	case faultTransient:
		if d.Attempt <= d.Value.K {
			how = settleNack
		}
	case faultPermanent:
		how = settleNackPermanent
	case faultPanic:
		how = settleNackNil
	}
	m.settle(h, how)
}

// receive records that st received d: a delivery begins. Only the
// partition's owner receives, and only while it is a member.
func (m *machine) receive(st *streamModel, d *pubsub.Delivery[job]) *delivery {
	owner := slices.Contains(st.g.Assignment()[st.consumer], d.Partition)
	m.mu.Lock()
	defer m.mu.Unlock()
	ep := m.beginLocked(st.group, st.consumer, true, d.Partition, d.Offset)
	switch {
	case st.left:
		m.violations = append(m.violations, fmt.Sprintf(
			"streams: %s/%s received p%d@%d after it left the group", st.group, st.consumer, d.Partition, d.Offset))
	case !owner:
		m.violations = append(m.violations, fmt.Sprintf(
			"ownership: %s/%s received p%d@%d, which the assignment gives to another", st.group, st.consumer, d.Partition, d.Offset))
	case d.Value.Fault == faultUndecodable:
		m.violations = append(m.violations, fmt.Sprintf(
			"decode: seq %d reached a stream though it cannot be decoded", d.Value.Seq))
	}
	h := &delivery{st: st, d: d, epoch: ep}
	st.held = append(st.held, h)
	return h
}

// settle acks or nacks h: the delivery ends (in the model first, so that
// the next one, which the settle lets come, finds the partition free).
func (m *machine) settle(h *delivery, how settlement) {
	d := h.d
	c := call{group: h.st.group, consumer: h.st.consumer, stream: true, partition: d.Partition, offset: d.Offset,
		attempt: d.Attempt, seq: d.Value.Seq, epoch: h.epoch, created: d.Created, outcome: failed}
	var err error
	switch how {
	case settleAck:
		c.outcome = acked
	case settleNack:
		err, c.kind = &nackError{seq: d.Value.Seq, attempt: d.Attempt}, "transient"
	case settleNackPermanent:
		err, c.kind = &nackError{seq: d.Value.Seq, attempt: d.Attempt, permanent: true}, "permanent"
	case settleNackNil:
		c.kind = "nacked"
	}
	m.mu.Lock()
	c.end = time.Now()
	m.endLocked(c)
	h.st.held = slices.DeleteFunc(h.st.held, func(x *delivery) bool { return x == h })
	m.spent = append(m.spent, d)
	m.mu.Unlock()
	if how == settleAck {
		d.Ack()
	} else {
		d.Nack(err)
	}
}

// giveBack records that st's held deliveries were given back (Stream.Close,
// or Close cancelling the handlers' context): they end without a failure.
func (m *machine) giveBack(st *streamModel) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range st.held {
		d := h.d
		m.endLocked(call{group: st.group, consumer: st.consumer, stream: true, partition: d.Partition, offset: d.Offset,
			attempt: d.Attempt, seq: d.Value.Seq, epoch: h.epoch, created: d.Created, outcome: givenBack, end: time.Now()})
		m.spent = append(m.spent, d)
	}
	st.held = nil
}

// ---- the handler ----

// beginLocked records that a delivery of (group, p) begins, and returns
// its epoch. No other delivery of the partition may be in hand (invariant
// 4's dynamic half: one consumer at a time, one delivery at a time), and
// none begins while the group is paused: Pause returned, so the deliveries
// in flight then were the last until Resume. The caller holds m.mu.
func (m *machine) beginLocked(group, consumer string, stream bool, p int, off int64) int {
	k := gp{group, p}
	if h, ok := m.busy[k]; ok {
		m.violations = append(m.violations, fmt.Sprintf(
			"ownership: %s/%s begins p%d@%d while %s has a delivery of the partition in hand", group, consumer, p, off, h.consumer))
	}
	m.busy[k] = holder{consumer: consumer, stream: stream}
	if m.paused[group] {
		m.violations = append(m.violations, fmt.Sprintf(
			"pause: %s/%s begins p%d@%d while the group is paused", group, consumer, p, off))
	}
	return m.epochIdx[k]
}

// endLocked records that a delivery ended. The caller holds m.mu.
func (m *machine) endLocked(c call) {
	delete(m.busy, gp{c.group, c.partition})
	m.calls = append(m.calls, c)
}

func (m *machine) handler(group, consumer string) pubsub.HandlerFunc[job] {
	return func(ctx context.Context, msg pubsub.Message[job]) error {
		m.mu.Lock()
		ep := m.beginLocked(group, consumer, false, msg.Partition, msg.Offset)
		m.mu.Unlock()
		if msg.Value.Sleep > 0 {
			time.Sleep(time.Duration(msg.Value.Sleep) * time.Millisecond) // virtual time; ignores ctx on purpose
		}

		c := call{group: group, consumer: consumer, partition: msg.Partition, offset: msg.Offset,
			attempt: msg.Attempt, seq: msg.Value.Seq, epoch: ep, created: msg.Created, outcome: failed}
		var err error
		switch msg.Value.Fault {
		case faultNone:
			c.outcome = acked
		case faultTransient:
			if msg.Attempt <= msg.Value.K {
				err, c.kind = &nackError{seq: msg.Value.Seq, attempt: msg.Attempt}, "transient"
			} else {
				c.outcome = acked
			}
		case faultPermanent:
			err, c.kind = &nackError{seq: msg.Value.Seq, attempt: msg.Attempt, permanent: true}, "permanent"
		case faultPanic:
			c.kind = "panic"
		case faultUndecodable:
			err, c.kind = fmt.Errorf("seq %d reached a handler though it cannot be decoded", msg.Value.Seq), "transient"
		}
		if c.outcome == failed && ctx.Err() != nil {
			c.outcome = cut // Close gave up: the worker drops what the handler says
		}
		m.mu.Lock()
		if msg.Value.Fault == faultUndecodable {
			m.violations = append(m.violations, "decode: "+err.Error())
		}
		c.end = time.Now()
		m.endLocked(c)
		m.mu.Unlock()
		if c.kind == "panic" {
			panic(fmt.Sprintf("poison seq %d", msg.Value.Seq))
		}
		return err
	}
}

// batchHandler is a batch consumer's handler. It acts out each message's
// fault in order, as handler does, and ends the batch at the first failure
// with a BatchError naming it: the messages after it are not processed, so
// they have no call. A panic fault panics when its message is the first of
// the batch (a panic fails the first message); later in a batch the
// handler reports it as a *PanicError at its index, as a handler that
// recovered it would. The delivery begins when the call does and every
// message of it ends when the call returns: the batch's commit follows
// that, once.
func (m *machine) batchHandler(group, consumer string) pubsub.BatchHandlerFunc[job] {
	return func(ctx context.Context, msgs []pubsub.Message[job]) error {
		first := msgs[0]
		m.mu.Lock()
		ep := m.beginLocked(group, consumer, false, first.Partition, first.Offset)
		m.mu.Unlock()
		var calls []call
		var err error
		var undecodable []string
		panicked := false
		for i, msg := range msgs {
			if msg.Attempt != first.Attempt || msg.Offset != first.Offset+int64(i) || msg.Partition != first.Partition {
				m.mu.Lock()
				m.violations = append(m.violations, fmt.Sprintf("batch: %s/%s message %d is p%d@%d attempt %d, after p%d@%d attempt %d",
					group, consumer, i, msg.Partition, msg.Offset, msg.Attempt, first.Partition, first.Offset, first.Attempt))
				m.mu.Unlock()
			}
			if msg.Value.Sleep > 0 {
				time.Sleep(time.Duration(msg.Value.Sleep) * time.Millisecond) // virtual time; ignores ctx on purpose
			}
			c := call{group: group, consumer: consumer, partition: msg.Partition, offset: msg.Offset,
				attempt: msg.Attempt, seq: msg.Value.Seq, epoch: ep, created: msg.Created, outcome: failed}
			var fail error
			switch msg.Value.Fault {
			case faultNone:
				c.outcome = acked
			case faultTransient:
				if msg.Attempt <= msg.Value.K {
					fail, c.kind = &nackError{seq: msg.Value.Seq, attempt: msg.Attempt}, "transient"
				} else {
					c.outcome = acked
				}
			case faultPermanent:
				fail, c.kind = &nackError{seq: msg.Value.Seq, attempt: msg.Attempt, permanent: true}, "permanent"
			case faultPanic:
				c.kind = "panic"
				if i == 0 {
					panicked = true
				} else {
					fail = &pubsub.PanicError{Value: fmt.Sprintf("poison seq %d", msg.Value.Seq)}
				}
			case faultUndecodable:
				fail, c.kind = fmt.Errorf("seq %d reached a handler though it cannot be decoded", msg.Value.Seq), "transient"
				undecodable = append(undecodable, "decode: "+fail.Error())
			}
			if c.outcome == failed && ctx.Err() != nil {
				c.outcome = cut // Close gave up: the worker drops what the handler says
			}
			calls = append(calls, c)
			if c.outcome != acked {
				if fail != nil {
					err = &pubsub.BatchError{Index: i, Err: fail}
				}
				break
			}
		}
		end := time.Now()
		m.mu.Lock()
		m.violations = append(m.violations, undecodable...)
		delete(m.busy, gp{group, first.Partition})
		for _, c := range calls {
			c.end = end
			m.calls = append(m.calls, c)
		}
		m.mu.Unlock()
		if panicked {
			panic(fmt.Sprintf("poison seq %d", first.Value.Seq))
		}
		return err
	}
}

// finalFailure reports whether c is a failed attempt after which the
// record is dead-lettered: one wrapping ErrPermanent, or one at
// MaxAttempts or beyond (an attempt given back counts, so a record can be
// tried more than MaxAttempts times; see givenBack).
func (m *machine) finalFailure(c call) bool {
	return c.outcome == failed && (c.kind == "permanent" || c.attempt >= m.maxAttempts)
}

// ---- invariants ----

// Check runs after every action, once the system is quiet.
func (m *machine) Check(t *rapid.T) {
	synctest.Wait()
	m.mu.Lock()
	violations := slices.Clone(m.violations)
	m.mu.Unlock()
	if len(violations) > 0 {
		for _, v := range violations {
			t.Log(v)
		}
		t.Fatalf("%d violations, first: %s", len(violations), violations[0])
	}
	m.checkCalls(t)
	m.foldHistory()
	m.checkDeadLetters(t)
	m.checkCommits(t)
	m.checkAccounting(t)
	m.checkTopicStats(t)
}

// foldHistory attributes the dead letters of records that cannot be
// decoded, which no consumer ever sees, to the current epoch of their
// partition. That is exact: such a record is dead-lettered at once, so the
// system being quiet means it is done, and every repositioning folds
// first. The dead letters of records a consumer saw are accounted where
// that delivery is (checkCalls: its final failure).
func (m *machine) foldHistory() {
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		letters := m.groups[group].DeadLetters()
		m.mu.Lock()
		for _, l := range letters[m.seenDead[group]:] {
			pos := pubsub.Position{Partition: l.Message.Partition, Offset: l.Message.Offset}
			if m.bySeq[m.byPos[pos]].job.Fault == faultUndecodable {
				eps := m.epochs[gp{group, l.Message.Partition}]
				eps[len(eps)-1].dead[l.Message.Offset]++
				m.wantLetterLocked(group, letter{l.Message.Partition, l.Message.Offset, 1, "decode"})
			}
		}
		m.seenDead[group] = len(letters)
		m.mu.Unlock()
	}
}

func (m *machine) wantLetterLocked(group string, l letter) {
	if m.wantLetters[group] == nil {
		m.wantLetters[group] = map[letter]int{}
	}
	m.wantLetters[group][l]++
}

// letterOf is what a dead letter says, as the model writes it: the kind is
// derived from the letter's error, and is "unexplained" when the error is
// not the one the record's last attempt failed with.
func (m *machine) letterOf(l pubsub.DeadLetter[job]) letter {
	pos := pubsub.Position{Partition: l.Message.Partition, Offset: l.Message.Offset}
	seq, ok := m.byPos[pos]
	_, isDecode := errors.AsType[*pubsub.DecodeError](l.Err)
	_, isPanic := errors.AsType[*pubsub.PanicError](l.Err)
	ne, isNack := errors.AsType[*nackError](l.Err)
	kind := "unexplained"
	switch {
	case !ok:
	case isDecode:
		if errors.Is(l.Err, errUndecodable) && errors.Is(l.Err, pubsub.ErrPermanent) {
			kind = "decode"
		}
	case l.Message.Value.Seq != seq:
		kind = fmt.Sprintf("carrying seq %d", l.Message.Value.Seq)
	case isPanic:
		kind = "panic"
	case isNack:
		if ne.seq == seq && ne.attempt == l.Attempts && errors.Is(l.Err, pubsub.ErrPermanent) == ne.permanent {
			kind = "transient"
			if ne.permanent {
				kind = "permanent"
			}
		}
	case l.Err != nil && !errors.Is(l.Err, pubsub.ErrPermanent):
		kind = "nacked"
	}
	return letter{l.Message.Partition, l.Message.Offset, l.Attempts, kind}
}

// checkDeadLetters: invariant 8. Each group's dead letters are exactly the
// ones its history explains: a record that cannot be decoded, after one
// attempt; a delivery that failed for good, after the attempts it made,
// with the error it failed with. The group counts them in DeadLettered.
func (m *machine) checkDeadLetters(t *rapid.T) {
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		g := m.groups[group]
		letters := g.DeadLetters()
		got := map[letter]int{}
		for _, l := range letters {
			got[m.letterOf(l)]++
		}
		m.mu.Lock()
		want := maps.Clone(m.wantLetters[group])
		m.mu.Unlock()
		if !maps.Equal(got, want) {
			for l := range maps.Keys(got) {
				if got[l] != want[l] {
					t.Logf("+ %s p%d@%d after %d attempts (%s): %d, want %d", group, l.partition, l.offset, l.attempts, l.kind, got[l], want[l])
				}
			}
			for l := range maps.Keys(want) {
				if _, ok := got[l]; !ok {
					t.Logf("- %s p%d@%d after %d attempts (%s): none, want %d", group, l.partition, l.offset, l.attempts, l.kind, want[l])
				}
			}
			t.Fatalf("dead letters: %s holds dead letters its history does not explain (-want +got in the log)", group)
		}
		if n := g.Stats().DeadLettered; n != int64(len(letters)) {
			t.Fatalf("accounting: %s holds %d dead letters but counted %d dead-lettered", group, len(letters), n)
		}
	}
}

// checkCalls walks the deliveries not seen yet:
//   - invariant 1: each carries the record published at its position, with
//     the Created the model stamped;
//   - invariant 2: no record whose publish failed is ever delivered;
//   - invariant 3: within an epoch, a partition's deliveries never go back
//     to an earlier offset, and never begin before the epoch's start (for
//     the first epoch, where the group's Start put it). (A delivery may
//     move on past a record without an outcome when retention evicted that
//     record while it waited for a retry; the accounting check holds such
//     a record to the group's Skipped count.)
//   - invariant 6: every repeated delivery is explained: attempt n+1 of an
//     offset follows, in the same epoch, attempt n failed but not for
//     good, or given back after it was received. A delivery taken back
//     before anyone received it was none, and its attempt comes again.
func (m *machine) checkCalls(t *rapid.T) {
	m.mu.Lock()
	calls := slices.Clone(m.calls[m.seenCalls:])
	m.seenCalls = len(m.calls)
	closedAt := m.closedAt
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
		if want := m.bySeq[seq].created; !c.created.Equal(want) {
			t.Fatalf("consistency: %v carries Created %v, but it was published at %v", c, c.created, want)
		}
		k := gp{c.group, c.partition}
		m.mu.Lock()
		e := m.epochs[k][c.epoch]
		m.mu.Unlock()
		if c.offset < e.start {
			t.Fatalf("start: %v delivers an offset before %d, where its epoch starts", c, e.start)
		}
		ke := gpEpoch{k, c.epoch}
		prev, hasPrev := m.lastCall[ke]
		switch {
		case !hasPrev || c.offset > prev.offset:
			if c.attempt != 1 {
				t.Fatalf("duplicates: %v is the first delivery of its offset in its epoch but has attempt %d", c, c.attempt)
			}
		case c.offset < prev.offset:
			t.Fatalf("order: %v went back from %v within an epoch", c, prev)
		default: // the same offset again
			again := prev.outcome == failed && !m.finalFailure(prev) || prev.outcome == givenBack
			if !again || c.attempt != prev.attempt+1 {
				t.Fatalf("duplicates: %v after %v is not explained by a retry or a give-back", c, prev)
			}
		}
		m.lastCall[ke] = c
		m.mu.Lock()
		switch {
		case c.outcome == acked && !closedAt.IsZero() && c.end.After(closedAt):
			m.lateAcks[c.group]++ // commits nothing: the cursor is sealed
		case c.outcome == acked:
			e.acked[c.offset]++
		case m.finalFailure(c):
			e.dead[c.offset]++
			m.wantLetterLocked(c.group, letter{c.partition, c.offset, c.attempt, c.kind})
		case c.outcome == failed:
			m.retried[c.group]++
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
// exactly the acks that committed (an ack after Close returned commits
// nothing, and its record "counts as not delivered"), and as Retried
// exactly the failed attempts that were not the last.
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
		m.mu.Lock()
		retried, late := m.retried[group], m.lateAcks[group]
		m.mu.Unlock()
		switch {
		case unexplained != stats.Skipped:
			t.Fatalf("accounting: %s passed %d offsets without an outcome but counted %d skipped", group, unexplained, stats.Skipped)
		// Delivered must be exactly the acks that committed: an ack after
		// Close returned commits nothing and its record "counts as not
		// delivered" (Broker.Close, Unfinished.Running;
		// TestLateAckAfterCloseCountsAsNotDelivered).
		case stats.Delivered != acks:
			t.Fatalf("accounting: %s's consumers acked %d times that committed (and %d after Close returned), but it counted %d delivered",
				group, acks, late, stats.Delivered)
		case retried != stats.Retried:
			t.Fatalf("accounting: %s's consumers failed %d attempts that were not the last, but it counted %d retried", group, retried, stats.Retried)
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

func (m *machine) committedAll() map[gp]int64 {
	out := map[gp]int64{}
	for group, g := range m.groups {
		for p := range m.partitions {
			out[gp{group, p}] = g.Committed(p)
		}
	}
	return out
}

// closeAndCheck is invariant 10. Close, called from several goroutines at
// once, returns by its context's end plus the 10ms grace, stops everything
// (no goroutine is left), reports exactly the partitions left behind and
// those whose handler was still running, and afterwards every operation
// fails with ErrClosed. It is drawn to be one of two:
//
//   - a drain: the test settles what it holds, the member streams are
//     pumped, and Close gets an hour, so every group that can move must
//     finish;
//   - abrupt: Close gets at most 25.5ms while the test holds deliveries
//     and leaves others unread, so it gives up: held deliveries are given
//     back, and a handler still running when Close returns commits nothing.
//     Settling a delivery Close took back must change nothing either.
func (m *machine) closeAndCheck(t *rapid.T) {
	abrupt := rapid.Bool().Draw(t, "abruptClose")
	timeout := time.Hour + time.Millisecond/2 // half a millisecond off: see Timing in the file comment
	stopPumps := func() {}
	if abrupt {
		timeout = rapid.SampledFrom([]time.Duration{time.Millisecond / 2, 5*time.Millisecond + time.Millisecond/2,
			25*time.Millisecond + time.Millisecond/2}).Draw(t, "closeTimeout")
	} else {
		for _, h := range m.held("") {
			m.settle(h, m.drawSettlement(t, false))
		}
		stopPumps = m.pump()
	}
	defer stopPumps()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = m.b.Close(ctx) })
	}
	wg.Wait()
	took := time.Since(start)
	m.mu.Lock()
	m.closedAt = time.Now()
	running := map[gp]bool{} // the handlers in flight now are the ones Close left running
	for k, h := range m.busy {
		if !h.stream {
			running[k] = true
		}
	}
	m.mu.Unlock()
	expired := ctx.Err() != nil
	switch {
	case took > timeout+closeGrace:
		t.Fatalf("close: Close took %v with a %v context; want at most %v more", took, timeout, closeGrace)
	case !abrupt && expired:
		t.Fatalf("close: with everything settled, Close did not finish within an hour: %v", errs[0])
	}
	// The first call's result, which later calls return (Close is
	// idempotent); a later call whose own context ends while it waits for
	// the first returns that context's error instead.
	// Equal results need not be one error value: compare what they say.
	result := m.b.Close(context.Background())
	same := func(a, b error) bool { return a == b || a != nil && b != nil && a.Error() == b.Error() }
	for _, err := range errs {
		_, isShutdown := errors.AsType[*pubsub.ShutdownError](err)
		if !same(err, result) && !(expired && errors.Is(err, context.DeadlineExceeded) && !isShutdown) {
			t.Fatalf("close: concurrent Close calls returned %v and %v", result, err)
		}
	}
	if !slices.ContainsFunc(errs, func(err error) bool { return same(err, result) }) {
		t.Fatalf("close: no concurrent Close call returned the result %v", result)
	}
	errs[0] = result
	if s := m.b.State(); s != pubsub.Stopped {
		t.Fatalf("close: state %v after Close", s)
	}

	var want []pubsub.Unfinished
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		for p := range m.partitions {
			_, end, _ := m.topic.Offsets(p)
			if c, run := m.groups[group].Committed(p), running[gp{group, p}]; c < end || run {
				want = append(want, pubsub.Unfinished{Group: group, Topic: "jobs", Partition: p, Committed: c, End: end, Running: run})
			}
		}
	}
	se, isShutdown := errors.AsType[*pubsub.ShutdownError](errs[0])
	switch {
	case want == nil && errs[0] != nil:
		t.Fatalf("close: nothing was left but Close returned %v", errs[0])
	case want != nil && (!isShutdown || !slices.Equal(se.Unfinished, want)):
		t.Fatalf("close: returned %v, want a ShutdownError listing %+v", errs[0], want)
	case want != nil && expired && !errors.Is(errs[0], context.DeadlineExceeded):
		t.Fatalf("close: its context ended first, but it returned %v", errs[0])
	}
	if !expired {
		for _, u := range want {
			if len(m.members[u.Group]) > 0 && !m.paused[u.Group] {
				t.Fatalf("close: active group %s left partition %d at %d of %d", u.Group, u.Partition, u.Committed, u.End)
			}
		}
	}
	stopPumps() // the channels closed: the pumps are done

	// What Close left behind stays behind. It took back the deliveries the
	// test held: settling them now does nothing. A handler it left running
	// ends later and commits nothing.
	committed := m.committedAll()
	var takenBack []*pubsub.Delivery[job]
	for _, h := range m.held("") {
		takenBack = append(takenBack, h.d)
	}
	for _, st := range m.streams {
		m.giveBack(st)
	}
	for _, d := range takenBack {
		if rapid.Bool().Draw(t, "ackTakenBack") {
			d.Ack()
		} else {
			d.Nack(&nackError{seq: d.Value.Seq, attempt: d.Attempt})
		}
	}
	time.Sleep(time.Second) // virtual: every handler ends
	synctest.Wait()
	if now := m.committedAll(); !maps.Equal(now, committed) {
		t.Fatalf("close: offsets committed after Close returned: %v, then %v", committed, now)
	}
	for _, st := range m.streams {
		select {
		case d, ok := <-st.s.C():
			if ok {
				t.Fatalf("close: C of %s/%s delivered p%d@%d after Close", st.group, st.consumer, d.Partition, d.Offset)
			}
		default:
			t.Fatalf("close: C of %s/%s still open after Close", st.group, st.consumer)
		}
	}
	if left := bubbleLeftovers(); len(left) > 0 {
		for _, g := range left {
			t.Logf("left behind:\n%s", g)
		}
		t.Fatalf("close: %d goroutines outlived Close", len(left))
	}
	m.Check(t) // every ack that returned before Close is in the committed offsets
	m.checkTally(t)

	if _, err := m.topic.PublishValue(context.Background(), job{}); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Publish after Close returned %v, want ErrClosed", err)
	}
	if _, err := m.topic.Subscribe("late", "c0", m.handler("late", "c0")); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Subscribe after Close returned %v, want ErrClosed", err)
	}
	if _, err := m.topic.Stream("late", "c0"); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("close: Stream after Close returned %v, want ErrClosed", err)
	}
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		g := m.groups[group]
		earliest, _, _ := m.topic.Offsets(0)
		for what, err := range map[string]error{
			"Seek":   g.Seek(context.Background(), 0, earliest),
			"Replay": g.Replay(context.Background(), pubsub.Earliest()),
			"Leave":  g.Leave(context.Background(), "c0"),
		} {
			if !errors.Is(err, pubsub.ErrClosed) {
				t.Fatalf("close: %s on %s after Close returned %v, want ErrClosed", what, group, err)
			}
		}
		if err := errors.Join(g.Pause(context.Background()), g.Resume(context.Background())); err != nil {
			t.Fatalf("close: Pause or Resume on %s after Close: %v, want nothing done", group, err)
		}
	}
}

// tally is a hook that counts what the broker reports, to check against
// its counters.
type tally struct {
	mu                                  sync.Mutex
	published, blocked, timedOut        int64
	dropped, expired                    int64
	retried, deadLettered, skipped, ack map[string]int64
}

func (y *tally) count(m *map[string]int64, group string, n int64) {
	y.mu.Lock()
	defer y.mu.Unlock()
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[group] += n
}

func (y *tally) add(n *int64, d int64) {
	y.mu.Lock()
	defer y.mu.Unlock()
	*n += d
}

func (y *tally) OnPublished(_ context.Context, _ *pubsub.PublishInfo, _ pubsub.Position, err error) {
	if err == nil {
		y.add(&y.published, 1)
	}
}

func (y *tally) OnBackpressure(e pubsub.BackpressureEvent) {
	if e.Err == nil {
		y.add(&y.blocked, 1)
	} else {
		y.add(&y.timedOut, 1)
	}
}

func (y *tally) OnDrop(e pubsub.TrimEvent)   { y.add(&y.dropped, e.Count) }
func (y *tally) OnExpire(e pubsub.TrimEvent) { y.add(&y.expired, e.Count) }
func (y *tally) OnRetry(e pubsub.RetryEvent) { y.count(&y.retried, e.Delivery.Group, 1) }
func (y *tally) OnDeadLetter(e pubsub.DeadLetterEvent) {
	y.count(&y.deadLettered, e.Delivery.Group, 1)
}
func (y *tally) OnSkip(e pubsub.SkipEvent) { y.count(&y.skipped, e.Group, e.To-e.From) }
func (y *tally) OnDelivered(_ context.Context, d *pubsub.DeliveryInfo, r pubsub.DeliveryResult) {
	if r.Outcome == pubsub.OutcomeAcked {
		y.count(&y.ack, d.Group, 1)
	}
}

// checkTally: the hooks saw exactly what the counters count. Every
// publish stored, wait, timeout, drop and expiry of the topic, every
// retry, dead letter and skipped record of each group; and at least as
// many acked deliveries as the group counts delivered (an ack that came
// after Close returned is not counted).
func (m *machine) checkTally(t *rapid.T) {
	if m.tally == nil {
		return
	}
	y := m.tally
	y.mu.Lock()
	defer y.mu.Unlock()
	ts := m.topic.Stats()
	for what, got := range map[string][2]int64{
		"published": {y.published, ts.Published}, "waited for room": {y.blocked, ts.Blocked},
		"timed out": {y.timedOut, ts.TimedOut}, "dropped": {y.dropped, ts.Dropped}, "expired": {y.expired, ts.Expired},
	} {
		if got[0] != got[1] {
			t.Fatalf("hooks: the topic %s %d records by its hooks, %d by its stats", what, got[0], got[1])
		}
	}
	for _, group := range slices.Sorted(maps.Keys(m.groups)) {
		s := m.groups[group].Stats()
		for what, got := range map[string][2]int64{
			"retried": {y.retried[group], s.Retried}, "dead-lettered": {y.deadLettered[group], s.DeadLettered},
			"skipped": {y.skipped[group], s.Skipped},
		} {
			if got[0] != got[1] {
				t.Fatalf("hooks: %s %s %d records by its hooks, %d by its stats", group, what, got[0], got[1])
			}
		}
		if y.ack[group] < s.Delivered {
			t.Fatalf("hooks: %s acked %d deliveries by its hooks, but counts %d delivered", group, y.ack[group], s.Delivered)
		}
	}
}
