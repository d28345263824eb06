package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/engine"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// priorityGroup is the one priority group of every consumer: with the
// pinned-client policy the server serves one client at a time, whatever
// the members believe about the assignment.
const priorityGroup = "logbus"

// group is a consumer group as this broker sees it: the server holds its
// consumers (one durable consumer per partition), its offsets, its pause
// and its dead letters; this broker holds its local members and their
// workers.
type group struct {
	e         *eng
	t         *topic
	name      string
	spec      engine.GroupSpec // as created, resolved
	consumers []natsjs.Consumer
	dlq       natsjs.Stream
	rdq       natsjs.Stream     // redriven dead letters, waiting to be delivered again (redrive.go)
	rconsumer []natsjs.Consumer // rdq's consumer per partition
	slots     []*slot

	// recMu serialises reconcile, which Subscribe, Leave, the loop and
	// exiting workers all call.
	recMu sync.Mutex
	// cfgMu serialises this broker's changes of the consumers'
	// configuration: pause, resume, and MaxAckPending (batch.go), which
	// rewrites the whole configuration and so must not undo a pause.
	cfgMu sync.Mutex

	mu       sync.Mutex // guards the fields below; never held across a server request or user code
	members  map[string]*member
	assign   map[string][]int   // the last assignment computed, of every live member
	order    []string           // its members, in the order they joined
	paused   bool               // Pause holds every slot
	pausedOn bool               // and the server confirmed the pause: from then on a resume by another broker releases the holds
	closed   bool               // shutdown began
	stopLoop context.CancelFunc // stops the loop and beat goroutines; nil until the first local member joins
	loopDone chan struct{}      // closed when the loop has exited
	beatDone chan struct{}      // closed when beat has exited
	health   health             // of the membership, as the loop and beat see it
	letters  map[string]error   // dead letters this process made, by letter ID: their original errors
	lettersQ []string           // their IDs, oldest first: at most the dead-letter limit are kept

	wake chan struct{} // buffered 1: the loop reconciles soon

	delivered, retried, deadLettered, skipped, redriven atomic.Int64
	// dropped counts the dead letters this process gave up storing
	// (dlq.go's dropLetter): counted in DeadLettersEvicted.
	dropped atomic.Int64

	snap atomic.Pointer[groupSnap] // what the reads return once the broker stopped

	// What was last read from the server (unavailable.go): the consumers,
	// the number of dead letters and how many were evicted, the oldest
	// uncommitted record's time.
	seen        []atomic.Pointer[consumerSeen]
	lettersSeen seenInt64
	evictedSeen seenInt64
	oldestSeen  []atomic.Pointer[oldestSeen]

	// gone is set once the group was deleted (lifecycle.go): why its calls
	// fail. suspectGone is set by a worker whose pull found no consumer:
	// the loop then asks whether the group is gone.
	gone        atomic.Pointer[error]
	suspectGone atomic.Bool
}

// member is a consumer of this broker in the group.
type member struct {
	name    string
	key     string
	h       engine.Handler      // nil for a batch consumer
	bh      engine.BatchHandler // a batch consumer's; nil otherwise
	batch   engine.BatchSpec    // a batch consumer's, resolved
	onLeave func()
	rev     uint64 // of its membership key
	left    bool
	evicted bool // its key expired and another broker took the name: it owns nothing
}

// storedSpec is what a group's consumers carry in their metadata, so that
// a broker joining an existing group can tell whether its options match.
const metaSpec = "logbus_spec"

func (e *eng) Subscribe(ctx context.Context, topic, group, consumer string, h engine.Handler, onLeave func(), spec engine.GroupSpec) (engine.Group, error) {
	if h == nil {
		return nil, fmt.Errorf("nil handler: %w", engine.ErrSubscription)
	}
	return e.subscribe(ctx, topic, group, &member{name: consumer, h: h, onLeave: onLeave}, spec)
}

// SubscribeBatch is Subscribe for a consumer whose handler takes batches
// (engine.BatchSubscriber): see batch.go.
func (e *eng) SubscribeBatch(ctx context.Context, topic, group, consumer string, h engine.BatchHandler, onLeave func(), spec engine.GroupSpec, batch engine.BatchSpec) (engine.Group, error) {
	if h == nil {
		return nil, fmt.Errorf("nil handler: %w", engine.ErrSubscription)
	}
	batch, err := batch.Resolve()
	if err != nil {
		return nil, err
	}
	return e.subscribe(ctx, topic, group, &member{name: consumer, bh: h, batch: batch, onLeave: onLeave}, spec)
}

// subscribe joins m, a member not yet in any group, to the group.
func (e *eng) subscribe(ctx context.Context, topic, group string, m *member, spec engine.GroupSpec) (engine.Group, error) {
	consumer := m.name
	what := fmt.Sprintf("subscribe %q to group %q", consumer, group)
	if err := e.refuse(what); err != nil {
		return nil, err
	}
	switch {
	case group == "":
		return nil, fmt.Errorf("empty group name: %w", engine.ErrSubscription)
	case consumer == "":
		return nil, fmt.Errorf("empty consumer name: %w", engine.ErrSubscription)
	}
	e.mu.Lock()
	t := e.topics[topic]
	g := e.groups[groupKey{topic, group}]
	e.mu.Unlock()
	if t == nil {
		return nil, fmt.Errorf("topic %q: %w", topic, engine.ErrTopicNotFound)
	}
	if err := e.names.checkGroup(topic, group, consumer, t.parts); err != nil {
		return nil, err
	}
	spec, err := spec.Resolve(e.retry)
	if err != nil {
		return nil, fmt.Errorf("group %q: %w", group, err)
	}
	if g == nil {
		if g, err = e.openGroup(ctx, t, group, &spec); err != nil {
			return nil, err
		}
	} else if !g.spec.Equal(spec) {
		return nil, fmt.Errorf("group %q exists with other options: %w", group, engine.ErrSubscription)
	}
	if err := g.join(ctx, m); err != nil {
		return nil, err
	}
	return g, nil
}

// openGroup finds the group's consumers on the server, creating them (and
// its dead-letter stream) when spec, resolved, is not nil, and registers
// the group in the broker. A nil spec with no consumers is
// ErrSubscription.
func (e *eng) openGroup(ctx context.Context, t *topic, name string, spec *engine.GroupSpec) (*group, error) {
	g := &group{e: e, t: t, name: name, members: map[string]*member{}, letters: map[string]error{},
		wake: make(chan struct{}, 1), consumers: make([]natsjs.Consumer, t.parts), slots: make([]*slot, t.parts),
		seen: make([]atomic.Pointer[consumerSeen], t.parts), oldestSeen: make([]atomic.Pointer[oldestSeen], t.parts)}
	for p := range g.slots {
		g.slots[p] = newSlot(p)
	}
	if spec != nil {
		g.spec = *spec
	}
	created := false
	var fresh []leaderOf // the consumers this broker created, whose leaders it spreads
	for p := range t.parts {
		c, err := e.js.Consumer(ctx, e.names.stream(t.name, p), e.names.consumer(name, p))
		if errors.Is(err, natsjs.ErrConsumerNotFound) && spec != nil {
			cfg := g.consumerConfig(p)
			if spec.Start.Kind != engine.StartEarliest {
				// Created paused, until it is moved to its start below: a
				// member of another broker that joins meanwhile must not
				// read from the first record.
				until := time.Now().Add(100 * 365 * 24 * time.Hour)
				cfg.PauseUntil = &until
			}
			c, err = e.js.CreateConsumer(ctx, e.names.stream(t.name, p), cfg)
			created = err == nil
			if created {
				fresh = append(fresh, consumerLeader(e.names.stream(t.name, p), c))
			}
		}
		if errors.Is(err, natsjs.ErrConsumerNotFound) {
			return nil, fmt.Errorf("no group %q on topic %q: %w", name, t.name, engine.ErrSubscription)
		}
		if err != nil {
			return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: %w", name, p, err))
		}
		var stored engine.GroupSpec
		if err := json.Unmarshal([]byte(c.CachedInfo().Config.Metadata[metaSpec]), &stored); err != nil {
			return nil, fmt.Errorf("group %q partition %d: consumer not made by logbus: %w", name, p, engine.ErrSubscription)
		}
		if spec == nil {
			g.spec = stored
		} else if !stored.Equal(g.spec) {
			return nil, fmt.Errorf("group %q exists with other options: %w", name, engine.ErrSubscription)
		}
		g.consumers[p] = c
		g.observeConsumer(p, c.CachedInfo())
	}
	e.spreadLeaders(ctx, fresh)
	var err error
	g.dlq, err = e.createStream(ctx, natsjs.StreamConfig{
		Name:      e.names.dlqStream(t.name, name),
		Subjects:  []string{e.names.dlqSubject(t.name, name)},
		Retention: natsjs.LimitsPolicy,
		MaxMsgs:   max(int64(g.spec.DeadLetterLimit), 1), // NoDeadLetters stores none (dlq.go), and -1 is no limit here
		Discard:   natsjs.DiscardOld,
		Storage:   t.streamConfig(0).Storage,
		// Read by batches of direct gets (dlq.go).
		AllowDirect: true,
	}, true)
	if err != nil {
		return nil, e.ctxErr(ctx, fmt.Errorf("group %q: dead-letter stream: %w", name, err))
	}
	if err := g.openRedrive(ctx); err != nil {
		return nil, e.ctxErr(ctx, fmt.Errorf("group %q: redrive stream: %w", name, err))
	}
	// What the reads serve until they read the server themselves
	// (reads.go: readLetterCounts).
	dst, rst := g.dlq.CachedInfo().State, g.rdq.CachedInfo().State
	g.lettersSeen.store(int64(dst.Msgs))
	g.evictedSeen.store(max(0, int64(dst.LastSeq)-int64(dst.Msgs)-int64(rst.LastSeq)-g.discarded(ctx)))
	if created && spec != nil && spec.Start.Kind != engine.StartEarliest {
		// The consumers deliver from the first record; move them to the
		// start before any member pulls (their members join after this).
		seqs, err := g.startSeqs(ctx, spec.Start)
		if err != nil {
			return nil, err
		}
		for p, seq := range seqs {
			if _, err := t.streams[p].ResetConsumerToSequence(ctx, e.names.consumer(name, p), seq); err != nil {
				return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: start at %v: %w", name, p, spec.Start, err))
			}
			if _, err := t.streams[p].ResumeConsumer(ctx, e.names.consumer(name, p)); err != nil {
				return nil, e.ctxErr(ctx, fmt.Errorf("group %q partition %d: %w", name, p, err))
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.groups[groupKey{t.name, name}]; cur != nil { // a concurrent Subscribe won
		return cur, nil
	}
	e.groups[groupKey{t.name, name}] = g
	return g, nil
}

// consumerLeader is a consumer of stream just created, for spreadLeaders.
func consumerLeader(stream string, c natsjs.Consumer) leaderOf {
	return leaderOf{stepdown: "CONSUMER.LEADER.STEPDOWN." + stream + "." + c.CachedInfo().Name,
		cluster: c.CachedInfo().Cluster, info: func(ctx context.Context) (*natsjs.ClusterInfo, error) {
			info, err := c.Info(ctx)
			if err != nil {
				return nil, err
			}
			return info.Cluster, nil
		}}
}

func (g *group) consumerConfig(p int) natsjs.ConsumerConfig {
	spec, _ := json.Marshal(g.spec)
	return natsjs.ConsumerConfig{
		Durable:        g.e.names.consumer(g.name, p),
		FilterSubject:  g.e.names.subject(g.t.name, p),
		AckPolicy:      natsjs.AckExplicitPolicy,
		AckWait:        g.e.cfg.ackWait,
		MaxDeliver:     -1, // the engine dead-letters; see worker.settle
		MaxAckPending:  1,  // one record in flight per partition: order under retries and failover
		DeliverPolicy:  natsjs.DeliverAllPolicy,
		PriorityGroups: []string{priorityGroup},
		PriorityPolicy: natsjs.PriorityPolicyPinned,
		PinnedTTL:      g.e.cfg.memberTTL,
		Metadata:       map[string]string{"logbus_group": g.name, metaSpec: string(spec)},
	}
}

// startSeqs returns, per partition, the stream sequence start names.
func (g *group) startSeqs(ctx context.Context, start engine.Start) ([]uint64, error) {
	seqs := make([]uint64, g.t.parts)
	for p, s := range g.t.streams {
		info, err := s.Info(ctx)
		if err != nil {
			return nil, g.e.ctxErr(ctx, fmt.Errorf("topic %q partition %d: %w", g.t.name, p, err))
		}
		first, last := info.State.FirstSeq, info.State.LastSeq
		if first == 0 {
			first = 1
		}
		switch start.Kind {
		case engine.StartEarliest:
			seqs[p] = first
		case engine.StartLatest:
			seqs[p] = last + 1
		case engine.StartOffset:
			seqs[p] = min(max(uint64(start.Offset)+1, first), last+1)
		case engine.StartTime:
			seq, err := g.seqAtTime(ctx, s, first, last, start.Time)
			if err != nil {
				return nil, err
			}
			seqs[p] = seq
		}
	}
	return seqs, nil
}

// seqAtTime returns the first sequence in [first, last] stored at or
// after t (last+1 when none): a binary search over the server's
// timestamps.
func (g *group) seqAtTime(ctx context.Context, s natsjs.Stream, first, last uint64, t time.Time) (uint64, error) {
	lo, hi := first, last+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := s.GetMsg(ctx, mid)
		if errors.Is(err, natsjs.ErrMsgNotFound) { // gone meanwhile: older than anything left
			lo = mid + 1
			continue
		}
		if err != nil {
			return 0, g.e.ctxErr(ctx, fmt.Errorf("topic %q: find time %v: %w", g.t.name, t, err))
		}
		if m.Time.Before(t) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}

func (g *group) Name() string { return g.name }
