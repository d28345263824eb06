package pubsubtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/logbus/logbus/internal/enum"
	"github.com/logbus/logbus/pubsub"
)

// History logs what an engine was asked to do and what it did: every
// publish (Published), every delivery's start and end (Observe wraps the
// handlers), and the events that allow a record to come again
// (Repositioned, Crashed, DeadLettered). Check then verifies the delivery
// guarantees every engine promises, from the log alone:
//
//   - At least once: every published record is completed by every group
//     that observed its topic: a handler returned nil for it, or it was
//     dead-lettered (the handler's error wrapped pubsub.ErrPermanent, or
//     DeadLettered named it).
//   - Order: within a group, a partition's deliveries never skip ahead of
//     a record not yet completed. A redelivery may restart from an older
//     offset, but a record after an unacked one is never started. Since a
//     key always lands in one partition, this is per-key order; Check also
//     verifies that each key was delivered from one partition only.
//   - Exclusive ownership: no two deliveries of the same (group, topic,
//     partition) are in flight at once, whoever their consumers.
//   - Every duplicate explained: a record a group had started before starts
//     again only with a higher Attempt, or after the partition changed
//     consumer, or after Repositioned named it. Report counts each kind,
//     so a test can also demand that there were none.
//
// It is written for engine authors (the failover tests of a distributed
// engine) and for tests of code that must tolerate redeliveries.
//
// A History is safe for concurrent use: the broker calls the observed
// handlers from many goroutines while the test publishes. No method blocks
// beyond a short critical section, and none calls user code under its lock.
// The zero History is not ready: use [NewHistory].
type History struct {
	mu     sync.Mutex
	events []Event
	// observed lists, per topic, the groups that wrapped a handler for it:
	// each must complete every record published to the topic.
	observed map[string]map[string]bool
}

// NewHistory returns an empty History. It does not block.
func NewHistory() *History {
	return &History{observed: map[string]map[string]bool{}}
}

// EventKind says what an Event records.
type EventKind int

const (
	// Publish: Topic, Partition, Offset of a record the test published.
	Publish EventKind = iota + 1
	// Start: a handler was called (every field but Err set).
	Start
	// End: the handler of the Start with the same Delivery returned (Err set
	// to what it returned, or a [*pubsub.PanicError]).
	End
	// Reposition: Group's Partition of Topic was sought or replayed
	// (Partition is -1 for every partition).
	Reposition
	// Crash: Consumer's connection died; its deliveries in flight are
	// abandoned.
	Crash
	// DeadLetter: Group dead-lettered the record at Topic, Partition, Offset.
	DeadLetter
)

var kindNames = []string{Publish: "publish", Start: "start", End: "end",
	Reposition: "reposition", Crash: "crash", DeadLetter: "dead-letter"}

func (k EventKind) String() string { return enum.Name(kindNames, "EventKind", k) }

// An Event is one entry of a History, in the order the History saw them.
type Event struct {
	Seq       int // index in the History, from 0
	Kind      EventKind
	Group     string
	Consumer  string
	Topic     string
	Partition int
	Offset    int64
	Key       string // the encoded key, as a string; "" for keyless records
	Attempt   int
	Err       error
	Delivery  int // for Start and End: the Seq of the Start
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s", e.Seq, e.Kind)
	switch e.Kind {
	case Publish:
		fmt.Fprintf(&b, " %s/%d@%d", e.Topic, e.Partition, e.Offset)
	case Start, End:
		fmt.Fprintf(&b, " %s/%s %s/%d@%d attempt %d", e.Group, e.Consumer, e.Topic, e.Partition, e.Offset, e.Attempt)
		if e.Kind == End {
			fmt.Fprintf(&b, " of #%d err=%v", e.Delivery, e.Err)
		}
	case Reposition:
		fmt.Fprintf(&b, " %s %s/%d", e.Group, e.Topic, e.Partition)
	case Crash:
		fmt.Fprintf(&b, " %s", e.Consumer)
	case DeadLetter:
		fmt.Fprintf(&b, " %s %s/%d@%d", e.Group, e.Topic, e.Partition, e.Offset)
	}
	return b.String()
}

func (h *History) add(e Event) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.Seq = len(h.events)
	if e.Kind == Start {
		e.Delivery = e.Seq
	}
	h.events = append(h.events, e)
	return e.Seq
}

// Published records that positions of topic were published: pass what
// Publish or PublishBatch returned. Check demands that every group observed
// on topic completes each of them, so record only what every such group
// must see (with StartAt, what comes after its start). A record may be
// delivered before Published names it: Check reads the whole log.
func (h *History) Published(topic string, positions ...pubsub.Position) {
	for _, p := range positions {
		h.add(Event{Kind: Publish, Topic: topic, Partition: p.Partition, Offset: p.Offset})
	}
}

// Repositioned records that group's partitions of topic were moved by Seek,
// Replay or a StartAt: a record delivered again afterwards is explained,
// and the partition may restart anywhere. With no partitions it means every
// partition. Call it after the call that moved them returned.
func (h *History) Repositioned(group, topic string, partitions ...int) {
	if len(partitions) == 0 {
		partitions = []int{-1}
	}
	for _, p := range partitions {
		h.add(Event{Kind: Reposition, Group: group, Topic: topic, Partition: p})
	}
}

// Crashed records that consumer died (its connection was cut, its process
// killed): from here, its deliveries are abandoned, those in flight and
// any it still starts (a record fetched before the crash), so another
// consumer may start their partitions and what they return does not count
// as completed. It applies to the consumer of that name in every group.
// Call it once the consumer can no longer ack.
func (h *History) Crashed(consumer string) {
	h.add(Event{Kind: Crash, Consumer: consumer})
}

// DeadLettered records that group dead-lettered the record at (topic,
// partition, offset): a failed delivery of it counts as completed, so the
// partition may move past it. It may be called at any time before Check,
// since an engine dead-letters after the failure the History saw.
// [NoteDeadLetters] records a whole group's dead letters.
func (h *History) DeadLettered(group, topic string, partition int, offset int64) {
	h.add(Event{Kind: DeadLetter, Group: group, Topic: topic, Partition: partition, Offset: offset})
}

// NoteDeadLetters records every dead letter g reports (g.DeadLetters), as
// DeadLettered does. Call it before Check, once g has dead-lettered what it
// will.
func NoteDeadLetters[V any](h *History, g *pubsub.Group[V]) {
	for _, d := range g.DeadLetters() {
		h.DeadLettered(g.Name(), d.Message.Topic, d.Message.Partition, d.Message.Offset)
	}
}

// Events returns a copy of the log, in order, for a test to print when
// Check fails. It is safe for concurrent use.
func (h *History) Events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// Observe returns a Handler that logs each call to next in h: a Start before
// it, an End with its result after it (a panic is logged as a
// [*pubsub.PanicError] and panics on). Pass the returned handler to Subscribe
// of topic, with the same group and consumer names. From now on, Check
// demands that group completes every record published to topic.
//
// The handler adds no lock around next and no wait: it is as concurrent as
// next is.
func Observe[V any](h *History, topic, group, consumer string, next pubsub.Handler[V]) pubsub.Handler[V] {
	h.mu.Lock()
	if h.observed[topic] == nil {
		h.observed[topic] = map[string]bool{}
	}
	h.observed[topic][group] = true
	h.mu.Unlock()
	return pubsub.HandlerFunc[V](func(ctx context.Context, msg pubsub.Message[V]) (err error) {
		e := Event{Kind: Start, Group: group, Consumer: consumer, Topic: msg.Topic,
			Partition: msg.Partition, Offset: msg.Offset, Key: string(msg.Key), Attempt: msg.Attempt}
		e.Delivery = h.add(e)
		e.Kind = End
		panicked := true
		defer func() {
			if panicked {
				v := recover()
				e.Err = &pubsub.PanicError{Value: v}
				h.add(e)
				panic(v)
			}
			e.Err = err
			h.add(e)
		}()
		err = next.Handle(ctx, msg)
		panicked = false
		return err
	})
}

// Report is what Check found.
type Report struct {
	Published  int // records published (Published), counted once per topic
	Deliveries int // handler calls (Starts)
	// Redeliveries counts deliveries of a record its group had started
	// before, by what explains them: "attempt" (a higher Attempt: a retry,
	// or a delivery whose ack was lost or whose consumer crashed),
	// "owner" (the partition changed consumer), "reposition" (Repositioned),
	// and "unexplained", which is also a violation.
	Redeliveries map[string]int
	Violations   []string // empty when every guarantee held
}

// Err returns nil if r has no violation, or an error listing them (at most
// 20, then how many more).
func (r Report) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	shown := r.Violations
	more := ""
	if len(shown) > 20 {
		more = fmt.Sprintf("\n... and %d more", len(shown)-20)
		shown = shown[:20]
	}
	return fmt.Errorf("pubsubtest: history: %d violations:\n%s%s", len(r.Violations), strings.Join(shown, "\n"), more)
}

// Redelivered returns the number of redeliveries, explained or not.
func (r Report) Redelivered() int {
	n := 0
	for _, c := range r.Redeliveries {
		n += c
	}
	return n
}

// Check verifies the guarantees listed on History against the log so far
// and reports what it found. Call it once the engine has settled (after
// Drain, or once a Recorder has seen everything): a record still in flight
// counts as not completed. It is safe for concurrent use and does not
// block beyond copying the log.
func (h *History) Check() Report {
	h.mu.Lock()
	events := slices.Clone(h.events)
	observed := map[string][]string{}
	for topic, groups := range h.observed {
		for g := range groups {
			observed[topic] = append(observed[topic], g)
		}
		slices.Sort(observed[topic])
	}
	h.mu.Unlock()
	return check(events, observed)
}

type recordID struct {
	topic     string
	partition int
	offset    int64
}

type partitionID struct {
	group, topic string
	partition    int
}

// partitionState is Check's view of one group's partition.
type partitionState struct {
	open map[int]Event // deliveries in flight, by Start Seq
	// base is where the partition's current epoch started (the first
	// start after a reposition), and done the offsets completed since:
	// a start may not pass the first offset from base not in done.
	base    int64
	hasBase bool
	done    map[int64]bool
	// movedAt is the Seq of the last reposition naming the partition: a
	// record started before it may start again.
	movedAt int
}

func check(events []Event, observed map[string][]string) Report {
	rep := Report{Redeliveries: map[string]int{}}
	violate := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
	}
	published := map[recordID]bool{}
	publishedTopics := map[string]bool{}
	parts := map[partitionID]*partitionState{}
	state := func(id partitionID) *partitionState {
		s := parts[id]
		if s == nil {
			s = &partitionState{open: map[int]Event{}, done: map[int64]bool{}, movedAt: -1}
			parts[id] = s
		}
		return s
	}
	type groupRecord struct {
		group string
		rec   recordID
	}
	lastStart := map[groupRecord]Event{} // the latest start of each record, per group
	completed := map[groupRecord]bool{}  // ever, in any epoch
	abandoned := map[int]bool{}          // Start Seqs whose consumer crashed in flight
	crashed := map[string]bool{}         // consumers that crashed
	keyPartition := map[[2]string]int{}  // (topic, key) -> partition
	complete := func(group string, rec recordID) {
		completed[groupRecord{group, rec}] = true
		state(partitionID{group, rec.topic, rec.partition}).done[rec.offset] = true
	}

	deadLetters := map[groupRecord]bool{}
	for _, e := range events {
		if e.Kind == DeadLetter {
			deadLetters[groupRecord{e.Group, recordID{e.Topic, e.Partition, e.Offset}}] = true
		}
	}
	for _, e := range events {
		switch e.Kind {
		case Publish:
			rec := recordID{e.Topic, e.Partition, e.Offset}
			if published[rec] {
				violate("%v: offset published twice", e)
			}
			published[rec] = true
			publishedTopics[e.Topic] = true
			rep.Published++

		case Reposition:
			for id, s := range parts {
				if id.group == e.Group && id.topic == e.Topic && (e.Partition < 0 || id.partition == e.Partition) {
					s.hasBase = false
					s.done = map[int64]bool{}
					s.movedAt = e.Seq
				}
			}
			if e.Partition >= 0 {
				s := state(partitionID{e.Group, e.Topic, e.Partition})
				s.hasBase, s.done, s.movedAt = false, map[int64]bool{}, e.Seq
			}

		case Crash:
			crashed[e.Consumer] = true
			for _, s := range parts {
				for seq, d := range s.open {
					if d.Consumer == e.Consumer {
						abandoned[seq] = true
						delete(s.open, seq)
					}
				}
			}

		case DeadLetter:
			// Read in the pre-pass: a record is dead-lettered when a
			// delivery of it fails, whenever the test learnt of it.

		case Start:
			rep.Deliveries++
			id := partitionID{e.Group, e.Topic, e.Partition}
			rec := recordID{e.Topic, e.Partition, e.Offset}
			s := state(id)
			if e.Attempt < 1 {
				violate("%v: attempt below 1", e)
			}
			if crashed[e.Consumer] {
				// A dead consumer's late start (of a record it had
				// fetched): nothing it does counts, and it holds nothing.
				abandoned[e.Seq] = true
				lastStart[groupRecord{e.Group, rec}] = e
				continue
			}
			for _, d := range s.open {
				violate("%v: partition already in flight in the group (%v)", e, d)
			}
			if e.Key != "" {
				k := [2]string{e.Topic, e.Key}
				if p, ok := keyPartition[k]; ok && p != e.Partition {
					violate("%v: key %q delivered from partitions %d and %d", e, e.Key, p, e.Partition)
				} else {
					keyPartition[k] = e.Partition
				}
			}
			// Order: the start may not pass the first offset of the epoch
			// that is not completed yet.
			if !s.hasBase {
				s.base, s.hasBase = e.Offset, true
			}
			next := s.base
			for s.done[next] {
				next++
			}
			if e.Offset > next {
				violate("%v: skips ahead of offset %d, not completed", e, next)
			}
			// Duplicates.
			gr := groupRecord{e.Group, rec}
			if prev, ok := lastStart[gr]; ok {
				switch {
				case e.Attempt > prev.Attempt:
					rep.Redeliveries["attempt"]++
				case s.movedAt > prev.Seq:
					rep.Redeliveries["reposition"]++
				case ownerChanged(events, id, prev, e):
					rep.Redeliveries["owner"]++
				default:
					rep.Redeliveries["unexplained"]++
					violate("%v: redelivery not explained by its attempt, a new owner or a reposition (before: %v)", e, prev)
				}
			}
			lastStart[gr] = e
			s.open[e.Seq] = e

		case End:
			s := state(partitionID{e.Group, e.Topic, e.Partition})
			if abandoned[e.Delivery] {
				continue // its consumer crashed: it could not ack
			}
			if _, ok := s.open[e.Delivery]; !ok {
				violate("%v: end of a delivery not in flight", e)
				continue
			}
			delete(s.open, e.Delivery)
			rec := recordID{e.Topic, e.Partition, e.Offset}
			if e.Err == nil || errors.Is(e.Err, pubsub.ErrPermanent) || deadLetters[groupRecord{e.Group, rec}] {
				complete(e.Group, rec)
			}
		}
	}

	// At least once, and nothing that was not published. Maps: sort
	// these, so that a failing run prints the same as the next.
	tail := len(rep.Violations)
	for rec := range published {
		for _, g := range observed[rec.topic] {
			if !completed[groupRecord{g, rec}] {
				violate("group %s never completed %s/%d@%d", g, rec.topic, rec.partition, rec.offset)
			}
		}
	}
	for gr := range lastStart {
		if publishedTopics[gr.rec.topic] && !published[gr.rec] {
			violate("group %s was delivered %s/%d@%d, which was not published", gr.group, gr.rec.topic, gr.rec.partition, gr.rec.offset)
		}
	}
	for id, s := range parts {
		for _, d := range s.open {
			violate("%v: still in flight (group %s)", d, id.group)
		}
	}
	slices.Sort(rep.Violations[tail:])
	return rep
}

// ownerChanged reports whether a start of id by a consumer other than
// prev's happened after prev and up to e (e included).
func ownerChanged(events []Event, id partitionID, prev, e Event) bool {
	for _, x := range events[prev.Seq+1 : e.Seq+1] {
		if x.Kind == Start && x.Group == id.group && x.Topic == id.topic && x.Partition == id.partition && x.Consumer != prev.Consumer {
			return true
		}
	}
	return false
}
