package properties

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest/conformance"
)

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

// orderKey is what an epoch's deliveries are ordered within: the whole
// partition, or with key concurrency each key (a keyless record being a
// key of its own, named by its offset).
type orderKey struct {
	gpEpoch
	key string
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

// startSpec is a group's drawn options: a Start, as the model resolves
// it, and its key concurrency.
type startSpec struct {
	kind   string // "" (no StartAt option), earliest, latest, offset, time
	offset int64
	at     time.Time
	// keys is the n of WithKeyConcurrency(n); 0 gives no option, which is
	// the same as 1.
	keys int
}

// concurrency is how many deliveries of a partition the group runs at
// once.
func (s startSpec) concurrency() int { return max(1, s.keys) }

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
	if s.keys > 0 {
		opts = append(opts, pubsub.WithKeyConcurrency(s.keys))
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
	return s.kind == o.kind && s.offset == o.offset && s.at.Equal(o.at) && s.concurrency() == o.concurrency()
}

func (s startSpec) String() string {
	start := s.start().String()
	if s.kind == "" {
		start = "no StartAt"
	}
	if s.keys > 0 {
		start += fmt.Sprintf(", WithKeyConcurrency(%d)", s.keys)
	}
	return start
}

// holder is who has a delivery of a (group, partition) in hand, and of
// which record.
type holder struct {
	consumer string
	stream   bool
	offset   int64
	key      string // the record's key; "" for a keyless record
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
	busy       map[gp][]holder // the deliveries begun and not ended
	paused     map[string]bool // written under mu; the test goroutine, the only writer, reads it without
	keyed      map[string]int  // each group's key concurrency, written (before the group exists) under mu
	epochIdx   map[gp]int
	violations []string
	spent      []*pubsub.Delivery[job] // settled or given back: Ack and Nack must do nothing now
	closedAt   time.Time               // when Close returned: a handler that ends later commits nothing

	epochs        map[gp][]*epoch
	lastCommitted map[gp]int64
	seenCalls     int                       // calls already folded into epochs
	seenDead      map[string]int            // dead letters already folded, per group
	lastCall      map[orderKey]call         // the latest call of each epoch of each (group, partition), per key with key concurrency
	wantLetters   map[string]map[letter]int // the dead letters the history explains, per group
	retried       map[string]int64          // failed attempts that were not the last, per group
	lateAcks      map[string]int64          // acks given after Close returned, per group

	tally *tally // the hooks' counts, when the run is observed
}

func newMachine(t *rapid.T, e conformance.Engine, tb testing.TB) *machine {
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
		busy:        map[gp][]holder{},
		paused:      map[string]bool{},
		keyed:       map[string]int{},
		epochIdx:    map[gp]int{},
		epochs:      map[gp][]*epoch{},
		seenDead:    map[string]int{},
		lastCall:    map[orderKey]call{},
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
