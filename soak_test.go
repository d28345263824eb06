package logbus_test

// The soak test: a million records through a busy broker with faults,
// checked record by record. It is skipped unless LOGBUS_SOAK=1 (and always
// under -short); .ci/run runs it without the race detector. Unlike the
// property suite it runs in real time with real concurrency: producers,
// workers, retries and rebalances all overlap.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

const (
	soakPartitions  = 8
	soakGroups      = 3
	soakProducers   = 4
	soakMaxAttempts = 3
)

// fault is what a record's handlers act out.
type fault int

const (
	faultNone      fault = iota
	faultTransient       // fails its first attempt, then acks
	faultPermanent       // fails wrapping ErrPermanent: dead-lettered after 1 attempt
	faultPanic           // panics on every attempt: dead-lettered after soakMaxAttempts
)

// soakFault decides, from the sequence number alone, what a record's
// handlers do: 1% fail their first attempt, 0.1% fail permanently, 0.05%
// panic on every attempt.
func soakFault(seq int) fault {
	switch h := (seq * 2654435761) % 10000; {
	case h < 5:
		return faultPanic
	case h < 15:
		return faultPermanent
	case h < 115:
		return faultTransient
	}
	return faultNone
}

// soakLog is what one group's handlers saw. Each slot is written only by the
// worker of the record's partition, and workers hand a partition over with
// a stop-then-start that orders their writes, so the slots need no lock:
// the race detector would see it if they did.
type soakLog struct {
	epoch      atomic.Int32
	deliveries [2][]uint8 // per epoch, per seq: handler calls
	acks       [2][]uint8 // per epoch, per seq
	lastOffset [soakPartitions]int64
	violations atomic.Int64
	firstBad   atomic.Pointer[string]
}

func (l *soakLog) violate(format string, args ...any) {
	if l.violations.Add(1) == 1 {
		msg := fmt.Sprintf(format, args...)
		l.firstBad.Store(&msg)
	}
}

func newSoakLog(n int) *soakLog {
	l := &soakLog{}
	for e := range l.deliveries {
		l.deliveries[e] = make([]uint8, n)
		l.acks[e] = make([]uint8, n)
	}
	for p := range l.lastOffset {
		l.lastOffset[p] = -1
	}
	return l
}

func (l *soakLog) handler(group string) pubsub.HandlerFunc[int] {
	return func(_ context.Context, msg pubsub.Message[int]) error {
		seq, e := msg.Value, l.epoch.Load()
		calls := l.deliveries[e][seq]
		if int(calls)+1 != msg.Attempt {
			l.violate("%s: seq %d attempt %d after %d calls in epoch %d", group, seq, msg.Attempt, calls, e)
		}
		if msg.Attempt == 1 {
			if msg.Offset <= l.lastOffset[msg.Partition] && e == 0 {
				l.violate("%s: partition %d went from offset %d to %d", group, msg.Partition, l.lastOffset[msg.Partition], msg.Offset)
			}
			l.lastOffset[msg.Partition] = msg.Offset
		}
		l.deliveries[e][seq]++
		switch soakFault(seq) {
		case faultPanic:
			panic("poison")
		case faultPermanent:
			return fmt.Errorf("seq %d: %w", seq, pubsub.ErrPermanent)
		case faultTransient:
			if msg.Attempt == 1 {
				return errors.New("transient")
			}
		}
		l.acks[e][seq]++
		return nil
	}
}

func TestSoak(t *testing.T) {
	if testing.Short() || os.Getenv("LOGBUS_SOAK") == "" {
		t.Skip("set LOGBUS_SOAK=1 to run the soak test")
	}
	const (
		blockRecords = 1_000_000
		dropRecords  = 200_000
	)
	start := time.Now()
	b := pubsub.NewBroker(pubsub.WithRetry(pubsub.RetryPolicy{
		MaxAttempts: soakMaxAttempts, BaseDelay: 20 * time.Microsecond, MaxDelay: time.Millisecond}))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()

	// Block: nothing may be lost. DropOldest, small: records are shed, and
	// every shed record must be accounted for.
	blocking := soakTopic(t, b, "orders", pubsub.Retention{MaxMessages: 1024, BlockTimeout: time.Minute})
	shedding := soakTopic(t, b, "metrics", pubsub.Retention{MaxMessages: 64, OnFull: pubsub.DropOldest})
	blockGroups := soakSubscribe(t, blocking, blockRecords)
	dropGroups := soakSubscribe(t, shedding, dropRecords)

	// Phase 1: half the records, with consumers joining and leaving.
	rebalances := soakPublish(t, blocking, 0, blockRecords/2, blockGroups)
	rebalances += soakPublish(t, shedding, 0, dropRecords, nil)
	soakDrain(t, b)

	// Checkpoint: the last group replays what the log retains, a second
	// epoch that must redeliver each retained record exactly as the first.
	replayed := blockGroups[soakGroups-1].group
	replayLog := blockGroups[soakGroups-1].log
	replayLog.epoch.Store(1)
	replayLog.lastOffset = [soakPartitions]int64{}
	var replayedRecords int64
	for p := range soakPartitions {
		earliest, end, _ := blocking.Offsets(p)
		replayedRecords += end - earliest
	}
	if err := replayed.Replay(context.Background(), pubsub.AtOffset(0)); err != nil {
		t.Fatal(err)
	}
	soakDrain(t, b)
	replayLog.epoch.Store(0)
	for p := range soakPartitions {
		replayLog.lastOffset[p] = replayed.Committed(p) - 1
	}

	// Phase 2: the other half.
	rebalances += soakPublish(t, blocking, blockRecords/2, blockRecords, blockGroups)
	soakDrain(t, b)
	elapsed := time.Since(start)

	blockSummary := soakCheck(t, "orders", blocking, blockGroups, blockRecords, false)
	dropSummary := soakCheck(t, "metrics", shedding, dropGroups, dropRecords, true)
	var replays int64 // records with an outcome in the replay epoch
	for _, n := range replayLog.deliveries[1] {
		if n > 0 {
			replays++
		}
	}
	if replays != replayedRecords {
		t.Errorf("replay: %d of the %d retained records were redelivered", replays, replayedRecords)
	}
	t.Logf("soak: %d records (%d Block + %d DropOldest) over %d partitions × %d groups, %d producers, %v, %.0f records/s",
		blockRecords+dropRecords, blockRecords, dropRecords, soakPartitions, soakGroups, soakProducers,
		elapsed.Round(time.Millisecond), float64(blockRecords+dropRecords)/elapsed.Seconds())
	t.Logf("soak: orders  %s", blockSummary)
	t.Logf("soak: metrics %s", dropSummary)
	t.Logf("soak: %d rebalances; a replay redelivered all %d retained records", rebalances, replays)
}

func soakDrain(t *testing.T, b *pubsub.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

func soakTopic(t *testing.T, b *pubsub.Broker, name string, r pubsub.Retention) *pubsub.Topic[string, int] {
	t.Helper()
	topic, err := pubsub.NewTopic(b, name, codec.String(), codec.Int[int](),
		pubsub.WithPartitions(soakPartitions), pubsub.WithRetention(r))
	if err != nil {
		t.Fatal(err)
	}
	return topic
}

// soakGroup is one consumer group and what its handlers saw.
type soakGroup struct {
	name   string
	group  *pubsub.Group[int]
	log    *soakLog
	extras int // consumers joined by churn and not yet gone
	limit  int // its dead-letter limit: every consumer joins with the group's options
}

func soakSubscribe(t *testing.T, topic *pubsub.Topic[string, int], n int) []*soakGroup {
	t.Helper()
	groups := make([]*soakGroup, soakGroups)
	for g := range groups {
		sg := &soakGroup{name: fmt.Sprintf("g%d", g), log: newSoakLog(n), limit: n}
		for c := range 2 {
			group, err := topic.Subscribe(sg.name, fmt.Sprintf("c%d", c), sg.log.handler(sg.name), pubsub.WithDeadLetterLimit(n))
			if err != nil {
				t.Fatal(err)
			}
			sg.group = group
		}
		groups[g] = sg
	}
	return groups
}

// soakPublish publishes seqs [from, to) from soakProducers goroutines, keyed
// so that keys collide. With churn (groups not nil), every 25,000 records a
// group gains a consumer or loses the one it gained, while the other
// producers keep publishing. It returns the number of rebalances.
func soakPublish(t *testing.T, topic *pubsub.Topic[string, int], from, to int, groups []*soakGroup) int {
	t.Helper()
	var next atomic.Int64
	next.Store(int64(from))
	var mu sync.Mutex // serialises the churn
	rebalances := 0
	var wg sync.WaitGroup
	for range soakProducers {
		wg.Go(func() {
			for {
				seq := int(next.Add(1) - 1)
				if seq >= to {
					return
				}
				if _, err := topic.Publish(context.Background(), fmt.Sprintf("k%d", seq%997), seq); err != nil {
					t.Errorf("publish %d: %v", seq, err)
					return
				}
				if groups != nil && seq%25_000 == 0 && seq > from {
					mu.Lock()
					soakChurn(t, topic, groups[(seq/25_000)%len(groups)])
					rebalances++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return rebalances
}

// soakChurn makes sg gain a consumer, or lose the one it gained last time.
func soakChurn(t *testing.T, topic *pubsub.Topic[string, int], sg *soakGroup) {
	if sg.extras > 0 {
		sg.extras--
		if err := sg.group.Leave(context.Background(), "extra"); err != nil {
			t.Errorf("churn: %v", err)
		}
		return
	}
	if _, err := topic.Subscribe(sg.name, "extra", sg.log.handler(sg.name), pubsub.WithDeadLetterLimit(sg.limit)); err != nil {
		t.Errorf("churn: %v", err)
	}
	sg.extras++
}

// soakWant is how often a record's handler is called, and how often it
// acks, in one epoch: the fault decides.
func soakWant(seq int) (calls, acks uint8) {
	switch soakFault(seq) {
	case faultTransient:
		return 2, 1
	case faultPermanent:
		return 1, 0
	case faultPanic:
		return soakMaxAttempts, 0
	}
	return 1, 1
}

// soakCheck checks one topic record by record and returns its figures.
// Without shedding, every record has exactly one outcome per group and
// exactly the deliveries its fault calls for. With shedding, a record may
// instead have been skipped, and the skipped records must equal the
// group's Skipped count.
func soakCheck(t *testing.T, name string, topic *pubsub.Topic[string, int], groups []*soakGroup, n int, shedding bool) string {
	t.Helper()
	var total struct{ deliveries, acks, dead, skipped int64 }
	for g, sg := range groups {
		l := sg.log
		if v := l.violations.Load(); v > 0 {
			t.Errorf("%s g%d: %d violations, first: %s", name, g, v, *l.firstBad.Load())
		}
		var dead, none int64
		for seq := range n {
			wantCalls, wantAcks := soakWant(seq)
			if wantAcks == 0 {
				dead++
			}
			// The replay epoch: a replayed record gets what any record gets.
			if c := l.deliveries[1][seq]; c > 0 {
				total.deliveries += int64(c)
				if c != wantCalls || l.acks[1][seq] != wantAcks {
					t.Errorf("%s g%d: replayed seq %d delivered %d times, acked %d, want %d and %d",
						name, g, seq, c, l.acks[1][seq], wantCalls, wantAcks)
				}
				if wantAcks == 0 {
					dead++
				}
			}
			calls, acks := l.deliveries[0][seq], l.acks[0][seq]
			total.deliveries += int64(calls)
			total.acks += int64(acks)
			if calls == wantCalls && acks == wantAcks {
				continue
			}
			if shedding && acks == 0 && calls < wantCalls {
				none++ // shed before (or between) its attempts
				if wantAcks == 0 {
					dead--
				}
				continue
			}
			t.Errorf("%s g%d: seq %d (fault %d) delivered %d times and acked %d, want %d and %d",
				name, g, seq, soakFault(seq), calls, acks, wantCalls, wantAcks)
			return ""
		}
		group := sg.group
		s := group.Stats()
		if s.Skipped != none || s.DeadLettered != dead || int64(len(group.DeadLetters())) != dead {
			t.Errorf("%s g%d: stats %+v with %d dead letters held; the records say %d skipped and %d dead-lettered",
				name, g, s, len(group.DeadLetters()), none, dead)
		}
		if !shedding && none != 0 {
			t.Errorf("%s g%d: %d records lost under Block", name, g, none)
		}
		total.dead += dead
		total.skipped += none
	}
	ts := topic.Stats()
	if ts.Published != int64(n) || ts.Published-int64(ts.Retained) != ts.Reclaimed+ts.Dropped+ts.Expired {
		t.Errorf("%s: topic stats %+v do not account for %d records", name, ts, n)
	}
	if !shedding && ts.Dropped != 0 {
		t.Errorf("%s: %d dropped under Block", name, ts.Dropped)
	}
	return fmt.Sprintf("deliveries %d, acks %d, dead letters %d, skipped %d, dropped %d (lost without a count: 0)",
		total.deliveries, total.acks, total.dead, total.skipped, ts.Dropped)
}
