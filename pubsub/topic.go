package pubsub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/engine"
)

// Topic is a named log of records with keys of type K and values of type V,
// split into a fixed number of partitions. Records with equal encoded keys
// always land in the same partition ([Partitioner]), and each partition is
// delivered to each group in offset order. All methods are safe for
// concurrent use. After [Broker.Close] the calls behave as [ErrClosed]
// says; after [Broker.DeleteTopic], as it says.
type Topic[K, V any] struct {
	b           *Broker
	eng         engine.Topic
	keys        codec.Codec[K]
	values      codec.Codec[V]
	partitioner Partitioner
	partitions  int   // the engine's count, fixed: read per record by route
	maxBytes    int64 // Retention.MaxBytes: a record larger fails before anything is appended

	// The codecs again when they can append: then records are encoded into
	// the buffers of records the engine reclaimed. See encodeKey.
	keyAppender   codec.Appender[K]
	valueAppender codec.Appender[V]

	mu     sync.Mutex           // guards groups
	groups map[string]*Group[V] // the typed handle of each group, so Subscribe returns the same one

	async *asyncState // PublishAsync's records and failures, for Flush

	// deleted is set by [Broker.DeleteTopic]: Subscribe, Stream and
	// SubscribeBatch, which name the topic to the engine, must not reach a
	// topic created again under the name.
	deleted atomic.Bool
}

// forgetGroup drops the handle of a deleted group: the next Subscribe to
// the name makes a new group, with a new handle.
func (t *Topic[K, V]) forgetGroup(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.groups, name)
}

func (t *Topic[K, V]) markDeleted() {
	t.deleted.Store(true)
	t.b.inFlight.remove(t.async) // its records in flight fail: Drain and Close have nothing to wait for
}

// errDeleted is the error of a call on the handle of a deleted topic.
func (t *Topic[K, V]) errDeleted() error {
	return fmt.Errorf("%w: the topic was deleted", ErrTopicNotFound)
}

// TopicOption configures a topic. Options only record; [NewTopic] checks
// them all at once.
type TopicOption interface{ applyTopic(*topicConfig) }

type topicConfig struct {
	engine.TopicSpec
	partitionsSet bool
	partitioner   Partitioner
	// maxInFlight bounds PublishAsync ([WithMaxInFlight]); 0 until set.
	maxInFlight    int
	maxInFlightSet bool
	err            error // the first invalid option, reported by NewTopic
}

// invalid records err unless an earlier option was invalid already.
func (c *topicConfig) invalid(err error) {
	if c.err == nil {
		c.err = err
	}
}

type topicOptionFunc func(*topicConfig)

func (f topicOptionFunc) applyTopic(c *topicConfig) { f(c) }

// WithPartitions sets the number of partitions, overriding the default of 1.
// It is fixed for the topic's life; n < 1 or n > [MaxPartitions] is
// [ErrInvalid], and so is a shape whose partitions × MaxMessages exceeds
// [MaxTopicMessages]. Partitions are the unit of parallelism: each group
// runs one worker per partition.
func WithPartitions(n int) TopicOption {
	return topicOptionFunc(func(c *topicConfig) { c.Partitions, c.partitionsSet = n, true })
}

// FullPolicy is what a full partition does with a new record
// ([Retention.OnFull]).
type FullPolicy int

const (
	// Block makes a publish wait for room, at most [Retention.BlockTimeout]
	// and never past its context, then fail with [ErrBackpressure] having
	// appended nothing; the error names the group holding the oldest record.
	// Room appears when the slowest group commits. Block waits only for
	// groups: see [Retention] for a partition that no group reads.
	//
	// A handler that publishes into a partition its own group keeps full
	// would wait for itself: the group commits the handler's record only once
	// the handler returns (the deadlock Tailscale's eventbus met). When that
	// is certain the publish fails at once with ErrBackpressure naming the
	// group. Certain means: the publish's ctx is the handler's (or
	// [BatchHandler]'s), or derived from it; the partition is the one the
	// handler is delivering; its group holds the partition's oldest record;
	// and the topic has no MaxAge, which could make room. So publish from the
	// handler, or from a goroutine it waits for, with its ctx, and give a
	// goroutine that outlives the handler a context of its own. Otherwise (a
	// context of another origin, another group holding the oldest record too,
	// a [Stream]'s consumer) the publish waits as above. To publish from a
	// handler into its own topic, give that topic [DropOldest], or room for
	// what one delivery publishes.
	Block FullPolicy = iota
	// DropOldest evicts the oldest record, read or not, so a publish never
	// waits. A group whose delivery of an evicted record had not begun skips
	// it and counts it in [GroupStats.Skipped] (a record waiting for a retry
	// is skipped too); the topic counts it in [TopicStats.Dropped].
	DropOldest
)

func (f FullPolicy) String() string { return engine.FullPolicy(f).String() }

// Retention bounds each partition of a topic ([WithRetention]). Zero fields
// mean the defaults.
//
// A partition holds at most MaxMessages records and, with MaxBytes, at
// most MaxBytes bytes of keys, values and headers. Records are not freed
// when acked, so a group can replay them; they are freed when the
// partition is full and every group has committed past them, or when
// MaxAge passes. A full partition that no group reads trims its oldest
// record, whatever OnFull says, and counts it in [TopicStats.Dropped]:
// publishers never wait for a reader that may never come, and a group
// created later starts at the oldest record still retained, so it finds
// the newest ones.
//
// Memory, as measured on go1.26 for amd64
// (TestRetentionDocStatesTheMemoryCost keeps these numbers true): a
// partition takes 680 bytes plus a slot of 8 bytes per record of
// MaxMessages, allocated by [NewTopic] whether or not records come (10.0
// KiB for the default 1024 records); a retained record takes 112 bytes plus
// its encoded key and value, each rounded up to an allocator size class,
// plus its headers, and about 25 bytes more once a group delivered it (its
// share of the record IDs the partition keeps formatted). So a topic holds
// at most about partitions × (10 KiB + MaxMessages × (140 bytes + key +
// value)): 4 partitions of 1024 records of 1 KiB take about 4.6 MiB.
// MaxBytes bounds the keys, values and headers, not the 140 bytes. With
// codecs that reuse a freed record's buffers ([codec.Appender]), which keep
// their capacity up to 1 KiB, the key and value to count are the largest
// ones, up to 1 KiB each. Each group adds a goroutine per partition, not
// counted here.
type Retention struct {
	// MaxMessages is the bounded buffer of each partition. Default 1024;
	// negative is [ErrInvalid], and so is a value that makes partitions ×
	// MaxMessages exceed [MaxTopicMessages].
	MaxMessages int
	// MaxAge trims records older than this (by the broker's [Clock]) whether
	// or not they were read; groups that had not read them count them as
	// Skipped. Trimming happens when the partition is next published to or
	// read, and a producer blocked on a full partition wakes when its oldest
	// record expires. 0 means no age limit.
	MaxAge time.Duration
	// OnFull is [Block] (the default) or [DropOldest].
	OnFull FullPolicy
	// BlockTimeout is how long [Block] makes a publish wait for room. Default
	// 1s.
	BlockTimeout time.Duration
	// MaxBytes is a bound on the bytes a partition retains: each record
	// counts its key, its value, and the keys and values of its headers
	// (bookkeeping is not counted); 0 means no byte bound; < 0 is
	// [ErrInvalid]. A partition is full when either bound is reached, and
	// frees (or, under Block, waits for) as many of its oldest records as
	// a new record needs to fit. A record that alone exceeds MaxBytes
	// could never fit: its Publish fails at once with ErrInvalid, and a
	// PublishBatch holding one fails before anything is published. Headers
	// a [HookPublish] adds count too.
	MaxBytes int64
}

// The limits of a topic's shape. Past them [NewTopic] fails at once with
// [ErrInvalid] naming the limit, before it allocates anything: a topic
// allocates a slot per record of MaxMessages in each partition when it is
// created (see [Retention]), so an absurd shape would otherwise be an
// out-of-memory crash rather than an error.
const (
	// MaxPartitions is the most partitions a topic may have
	// ([WithPartitions]): far more than any machine has cores to run.
	MaxPartitions = 1 << 16 // 65,536
	// MaxTopicMessages bounds partitions × [Retention.MaxMessages], the
	// records a topic may retain at most, and so MaxMessages itself: 16 Mi
	// slots, 128 MiB allocated by [NewTopic].
	MaxTopicMessages = 1 << 24 // 16,777,216
)

// The limits above, [MaxBatchSize] and [MaxKeyConcurrency] are the engine
// package's, which the engines enforce; they are written out here so that
// go doc shows their values. This compiles only while each pair is equal:
// an index into a one-element array must be 0.
func _() {
	var x [1]struct{}
	_ = x[MaxPartitions-engine.MaxPartitions]
	_ = x[MaxTopicMessages-engine.MaxTopicMessages]
	_ = x[MaxBatchSize-engine.MaxBatchSize]
	_ = x[MaxKeyConcurrency-engine.MaxKeyConcurrency]
}

// WithRetention sets the retention of every partition, overriding the
// defaults field by field (a zero field keeps its default: see [Retention]).
func WithRetention(r Retention) TopicOption {
	return topicOptionFunc(func(c *topicConfig) {
		c.Retention = engine.Retention{MaxMessages: r.MaxMessages, MaxAge: r.MaxAge,
			OnFull: engine.FullPolicy(r.OnFull), BlockTimeout: r.BlockTimeout, MaxBytes: r.MaxBytes}
	})
}

// NewTopic creates the topic name on b, with a codec for its keys and one for
// its values. K and V are inferred from the codecs:
//
//	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.JSON[Order]())
//
// It fails with [ErrTopicExists] for a name already taken, [ErrInvalid] for
// an empty name, a nil codec or a bad option, and [ErrClosed] once Close
// began. It does not block.
func NewTopic[K, V any](b *Broker, name string, keys codec.Codec[K], values codec.Codec[V], opts ...TopicOption) (*Topic[K, V], error) {
	switch {
	case b == nil || b.eng == nil:
		return nil, fail(errNoBroker, "new topic %q", name)
	case b.err != nil:
		return nil, fmt.Errorf("logbus: new topic %q: broker options: %w", name, errors.Unwrap(b.err))
	case keys == nil:
		return nil, fail(fmt.Errorf("%w: nil key codec", ErrInvalid), "new topic %q", name)
	case values == nil:
		return nil, fail(fmt.Errorf("%w: nil value codec", ErrInvalid), "new topic %q", name)
	}
	var cfg topicConfig
	for i, o := range opts {
		if o == nil {
			cfg.invalid(fmt.Errorf("%w: option %d is nil", ErrInvalid, i))
			continue
		}
		o.applyTopic(&cfg)
	}
	if cfg.err != nil {
		return nil, fail(cfg.err, "new topic %q", name)
	}
	if cfg.partitionsSet && cfg.Partitions < 1 {
		return nil, fail(fmt.Errorf("%w: %d partitions, want at least 1", ErrInvalid, cfg.Partitions), "new topic %q", name)
	}
	if cfg.maxInFlightSet && cfg.maxInFlight < 1 {
		return nil, fail(fmt.Errorf("%w: WithMaxInFlight(%d), want at least 1", ErrInvalid, cfg.maxInFlight), "new topic %q", name)
	}
	if !cfg.maxInFlightSet {
		cfg.maxInFlight = DefaultMaxInFlight
	}
	if cfg.partitioner == nil {
		cfg.partitioner = KeyHash()
	}
	if err := retentionNeeds(b.caps, cfg.Retention); err != nil {
		return nil, fail(err, "new topic %q", name)
	}
	t, err := b.eng.CreateTopic(context.Background(), name, cfg.TopicSpec)
	if err != nil {
		return nil, fail(err, "new topic %q", name)
	}
	topic := &Topic[K, V]{b: b, eng: t, keys: keys, values: values, partitioner: cfg.partitioner, partitions: t.Partitions(),
		maxBytes: cfg.Retention.MaxBytes, groups: make(map[string]*Group[V]), async: newAsyncState(t, cfg)}
	b.reg.addTopic(t, topic)
	if topic.async.app != nil {
		b.inFlight.add(topic.async)
	}
	topic.keyAppender, _ = keys.(codec.Appender[K])
	topic.valueAppender, _ = values.(codec.Appender[V])
	return topic, nil
}

// Name returns the topic's name.
func (t *Topic[K, V]) Name() string { return t.eng.Name() }

// Partitions returns the number of partitions.
func (t *Topic[K, V]) Partitions() int { return t.eng.Partitions() }

// Position is where a published record landed. A call that publishes
// nothing returns Position{Partition: -1, Offset: -1}, which no record
// ever has, with its error: a failed [Topic.Publish] or
// [Topic.PublishValue], a failed [Pending], and the publish hooks' report
// of a record that failed ([HookPublished]).
type Position struct {
	Partition int
	Offset    int64
}

// noPosition is the Position of a record that was not published.
var noPosition = Position{Partition: -1, Offset: -1}

// PublishOption configures one publish.
type PublishOption interface{ applyPublish(*publishConfig) }

type publishConfig struct{ headers map[string]string }

type headersOption map[string]string

func (h headersOption) applyPublish(c *publishConfig) { c.headers = h }

// WithHeaders attaches headers to the record ([Message.Headers]). The map
// is copied: changing it after the publish returns changes nothing.
func WithHeaders(h map[string]string) PublishOption { return headersOption(h) }

// Publish encodes key and value and appends the record to the partition the
// key routes to, returning where it landed.
//
// Publish returns as soon as the record is in the log; it does not wait for
// delivery (nor, after [Topic.PublishAsync] calls, for anything but the
// records ahead of it in its partition: see PublishAsync's order). It
// blocks only when the partition is full and the topic's retention says
// [Block], as long as Block says, failing with [ErrBackpressure] or ctx's
// error. A value or key the codec cannot encode fails with the codec's
// error. After Close began it fails with [ErrClosed]. A failed Publish
// appends nothing (see [Position]), and the next record takes the offset.
func (t *Topic[K, V]) Publish(ctx context.Context, key K, value V, opts ...PublishOption) (Position, error) {
	rec := t.eng.NewRecord()
	if err := t.encodeKey(rec, key); err != nil {
		return noPosition, fail(err, "publish to topic %q", t.Name())
	}
	return t.publish(ctx, rec, value, opts)
}

// PublishValue is [Topic.Publish] for a keyless record: the partitioner
// spreads such records (round robin by default, [KeyHash]), so they have
// no order relative to each other across partitions. [Message.Key] is nil on
// delivery.
func (t *Topic[K, V]) PublishValue(ctx context.Context, value V, opts ...PublishOption) (Position, error) {
	rec := t.eng.NewRecord()
	rec.Key = nil // keyless
	return t.publish(ctx, rec, value, opts)
}

// publish encodes value into rec, whose key is set, routes it and
// publishes it.
func (t *Topic[K, V]) publish(ctx context.Context, rec *engine.Record, value V, opts []PublishOption) (Position, error) {
	p, err := t.prepare(ctx, rec, value, opts)
	if err == nil {
		var pos Position
		if pos, err = t.appendOne(ctx, p, rec); err == nil {
			return pos, nil
		}
	}
	return noPosition, fail(err, "publish to topic %q", t.Name())
}

// prepare encodes value into rec, whose key is set, applies opts and
// routes rec: the part of a publish that fails alike on every engine. It
// returns rec's partition.
func (t *Topic[K, V]) prepare(ctx context.Context, rec *engine.Record, value V, opts []PublishOption) (int, error) {
	if err := t.encodeValue(rec, value); err != nil {
		return 0, err
	}
	if ctx == nil {
		return 0, errNilContext
	}
	if len(opts) > 0 {
		cfg, err := applyPublishOptions(opts)
		if err != nil {
			return 0, err
		}
		rec.Headers = maps.Clone(cfg.headers)
	}
	return t.route(rec)
}

// appendOne appends rec to partition p and waits for the engine to store
// it, raising the publish hooks around it when there are any. Its error
// is the engine's, without the "logbus: publish" prefix.
func (t *Topic[K, V]) appendOne(ctx context.Context, p int, rec *engine.Record) (Position, error) {
	if o := t.b.obs; o != nil && o.publishes {
		return t.publishObserved(ctx, o, p, rec)
	}
	offset, err := t.appendEngine(ctx, p, rec)
	if err != nil {
		return noPosition, err
	}
	return Position{Partition: p, Offset: offset}, nil
}

// appendEngine is the engine's AppendOne, refused once Close began (the
// engine refuses publishes only once its own Close begins, after the
// broker's waited for the records PublishAsync has in flight), and made
// after the partition's asynchronous records ahead of it resolved.
func (t *Topic[K, V]) appendEngine(ctx context.Context, p int, rec *engine.Record) (int64, error) {
	if t.b.closing.Load() {
		return 0, ErrClosed
	}
	if err := t.async.waitPartition(ctx, p); err != nil {
		return 0, err
	}
	return t.eng.AppendOne(ctx, p, rec)
}

// publishObserved is the end of publish when publish hooks exist: they
// see the record before it is appended, and its fate after.
func (t *Topic[K, V]) publishObserved(ctx context.Context, o *observer, p int, rec *engine.Record) (Position, error) {
	info := PublishInfo{Topic: t.Name(), Partition: p, Key: rec.Key, Size: len(rec.Key) + len(rec.Value), Headers: rec.Headers}
	hctx := o.onPublish(ctx, &info)
	rec.Headers, info.Key = info.Headers, nil // the record is the engine's once appended
	pos := Position{Partition: p}
	offset, err := t.appendEngine(ctx, p, rec)
	if err != nil {
		pos = noPosition
		o.onPublished(hctx, &info, pos, fail(err, "publish to topic %q", t.Name()))
		return pos, err
	}
	pos.Offset = offset
	info.ID = t.recordID(pos)
	o.onPublished(hctx, &info, pos, nil)
	return pos, nil
}

// recordID is the ID of the record stored at pos, when the engine can
// tell; for the publish hooks.
func (t *Topic[K, V]) recordID(pos Position) string {
	if ider, ok := t.eng.(engine.RecordIDer); ok {
		return ider.RecordID(pos.Partition, pos.Offset)
	}
	return ""
}

// route picks rec's partition and checks that rec can be stored there at
// all: here, above the engine, so that every engine routes a key alike.
func (t *Topic[K, V]) route(rec *engine.Record) (int, error) {
	n := t.partitions
	p := t.partitioner.Partition(rec.Key, n)
	if p < 0 || p >= n {
		return 0, fmt.Errorf("%w: partitioner chose partition %d of %d", ErrInvalid, p, n)
	}
	if t.maxBytes > 0 && engine.RecordBytes(rec) > t.maxBytes {
		return 0, fmt.Errorf("%w: partition %d: a record of %s can never fit in MaxBytes %d",
			ErrInvalid, p, engine.DescribeSize(rec), t.maxBytes)
	}
	return p, nil
}

// encodeKey puts the encoding of key in rec, a record from the engine's
// NewRecord.
func (t *Topic[K, V]) encodeKey(rec *engine.Record, key K) error {
	if err := encodeInto(&rec.Key, t.keys, t.keyAppender, key); err != nil {
		return fmt.Errorf("%w: encode key: %w", ErrInvalid, err)
	}
	if rec.Key == nil {
		rec.Key = []byte{} // keyed, even when the key encodes to nothing
	}
	return nil
}

// encodeValue puts the encoding of value in rec, a record from the engine's
// NewRecord.
func (t *Topic[K, V]) encodeValue(rec *engine.Record, value V) error {
	if err := encodeInto(&rec.Value, t.values, t.valueAppender, value); err != nil {
		return fmt.Errorf("%w: encode value: %w", ErrInvalid, err)
	}
	return nil
}

// encodeInto sets *buf to the encoding of v: appended to the memory *buf
// already has (a reclaimed record's buffer) when the codec can append, so
// that publishing does not allocate it, else Encode's fresh slice.
func encodeInto[T any](buf *[]byte, c codec.Codec[T], app codec.Appender[T], v T) error {
	var err error
	if app != nil {
		*buf, err = app.AppendEncode((*buf)[:0], v)
	} else {
		*buf, err = c.Encode(v)
	}
	return err
}

// Entry is one record of a batch for [Topic.PublishBatch].
type Entry[K, V any] struct {
	Key     K
	Value   V
	Headers map[string]string // copied; nil for none
}

// PublishBatch publishes entries in order, as [Topic.Publish] would one by
// one, and returns where the records it published landed, in batch order:
// all of them, or, with an error, the first len(positions), which are in
// the log; the entries after those are not, and can be published again.
// Records with equal keys keep their batch order.
//
// A batch costs less than as many Publish calls: the clock is read once,
// so every record of the batch has the same Created, and each run of
// consecutive records bound for one partition is appended under one lock,
// waking the partition's readers once. Another producer's records may land
// between two runs.
//
// Every entry is encoded before anything is published: one the codecs
// cannot encode fails the whole batch, with no positions. Under [Block],
// the call waits for room as often as it needs to, each record as long as
// Block says. After Close began it fails with [ErrClosed].
func (t *Topic[K, V]) PublishBatch(ctx context.Context, entries []Entry[K, V]) ([]Position, error) {
	return t.publishBatch(ctx, len(entries), func(i int, rec *engine.Record) error {
		e := entries[i]
		err := t.encodeKey(rec, e.Key)
		if err == nil {
			err = t.encodeValue(rec, e.Value)
		}
		rec.Headers = e.Headers
		return err
	})
}

// PublishValues is [Topic.PublishBatch] for keyless records, spread by the
// partitioner as [Topic.PublishValue]'s are.
func (t *Topic[K, V]) PublishValues(ctx context.Context, values []V) ([]Position, error) {
	return t.publishBatch(ctx, len(values), func(i int, rec *engine.Record) error {
		rec.Key = nil // keyless
		return t.encodeValue(rec, values[i])
	})
}

// publishBatch hands the engine n records, which encode(i, rec) fills with
// entry i: all encoded and routed first, then appended in one call, run by
// run, a run being consecutive records bound for one partition.
func (t *Topic[K, V]) publishBatch(ctx context.Context, n int, encode func(i int, rec *engine.Record) error) ([]Position, error) {
	if ctx == nil {
		return nil, fail(errNilContext, "publish batch to topic %q", t.Name())
	}
	scratch := getBatchScratch(n)
	defer putBatchScratch(scratch)
	recs, offsets, partitions := scratch.recs, scratch.offsets, scratch.partitions
	positions := make([]Position, n)
	t.eng.NewRecords(recs)
	for i, rec := range recs {
		if err := encode(i, rec); err != nil {
			return nil, fail(fmt.Errorf("entry %d: %w", i, err), "publish batch to topic %q", t.Name())
		}
		p, err := t.route(rec)
		if err != nil {
			return nil, fail(fmt.Errorf("entry %d: %w", i, err), "publish batch to topic %q", t.Name())
		}
		rec.Headers = maps.Clone(rec.Headers)
		positions[i].Partition, partitions[i] = p, p
	}
	var infos []PublishInfo
	var hctxs []context.Context
	if o := t.b.obs; o != nil && o.publishes {
		infos, hctxs = make([]PublishInfo, n), make([]context.Context, n)
		for i, rec := range recs {
			infos[i] = PublishInfo{Topic: t.Name(), Partition: partitions[i], Key: rec.Key,
				Size: len(rec.Key) + len(rec.Value), Headers: rec.Headers, Batch: n}
			hctxs[i] = o.onPublish(ctx, &infos[i])
			rec.Headers, infos[i].Key = infos[i].Headers, nil
		}
	}
	stored, err := 0, error(ErrClosed) // see appendEngine
	if !t.b.closing.Load() {
		if err = t.async.wait(ctx); err == nil {
			stored, err = t.eng.AppendBatch(ctx, partitions, recs, offsets)
		}
	}
	for i := range stored {
		positions[i].Offset = offsets[i]
	}
	if err != nil {
		err = fail(err, "publish batch to topic %q", t.Name())
	}
	for i := range infos { // none when no publish hook listens
		if i < stored {
			infos[i].ID = t.recordID(positions[i])
			t.b.obs.onPublished(hctxs[i], &infos[i], positions[i], nil)
		} else {
			t.b.obs.onPublished(hctxs[i], &infos[i], noPosition, err)
		}
	}
	if err != nil {
		return positions[:stored], err
	}
	return positions, nil
}

// batchScratch is what a batch publish needs only while it runs: its
// records until the engine takes them, their partitions and their offsets.
// Pooled, since a batch is published by a call per batch and the slices are
// as long as it.
type batchScratch struct {
	recs       []*engine.Record
	offsets    []int64
	partitions []int
}

var batchScratches sync.Pool // of *batchScratch

// maxPooledBatch bounds the slices the pool keeps, so that one huge batch
// does not pin them.
const maxPooledBatch = 4096

func getBatchScratch(n int) *batchScratch {
	if s, ok := batchScratches.Get().(*batchScratch); ok && cap(s.recs) >= n {
		s.recs, s.offsets, s.partitions = s.recs[:n], s.offsets[:n], s.partitions[:n]
		return s
	}
	return &batchScratch{recs: make([]*engine.Record, n), offsets: make([]int64, n), partitions: make([]int, n)}
}

func putBatchScratch(s *batchScratch) {
	if cap(s.recs) > maxPooledBatch {
		return
	}
	clear(s.recs) // the records belong to the engine now
	batchScratches.Put(s)
}

// applyPublishOptions is apart from publish so that the config, which the
// options reach through an interface and so escapes, is allocated only
// when there are options. A nil option is [ErrInvalid].
func applyPublishOptions(opts []PublishOption) (publishConfig, error) {
	var cfg publishConfig
	for i, o := range opts {
		if o == nil {
			return cfg, fmt.Errorf("%w: option %d is nil", ErrInvalid, i)
		}
		o.applyPublish(&cfg)
	}
	return cfg, nil
}

// TopicStats counts what happened to a topic's records, over all partitions
// ([Topic.Stats]). Every record that left the log is counted once:
// Published − Retained == Reclaimed + Dropped + Expired.
type TopicStats struct {
	Published int64 // records appended (the sum of the partitions' end offsets)
	Retained  int   // records held now
	// RetainedBytes is the bytes of the records held now as
	// [Retention.MaxBytes] counts them (keys, values and headers), what it
	// bounds in each partition.
	RetainedBytes int64
	Reclaimed     int64 // records freed after every group had committed past them
	Dropped       int64 // records shed by DropOldest, or trimmed from a full partition that no group reads
	Expired       int64 // records MaxAge trimmed, read or not
	Blocked       int64 // publishes that had to wait for room
	TimedOut      int64 // publishes that failed with ErrBackpressure
}

// Stats returns the topic's counters. It does not block.
func (t *Topic[K, V]) Stats() TopicStats { return topicStats(t.eng.Stats()) }

// Offsets returns a partition's earliest retained offset and its end offset
// (the offset the next record will get): the range [Group.Seek] accepts. A
// partition that does not exist is [ErrInvalid]. It does not block.
func (t *Topic[K, V]) Offsets(partition int) (earliest, end int64, err error) {
	stats := t.eng.Stats()
	if partition < 0 || partition >= len(stats) {
		return 0, 0, fmt.Errorf("logbus: offsets of topic %q: %w: no partition %d", t.Name(), ErrInvalid, partition)
	}
	return stats[partition].Earliest, stats[partition].End, nil
}

// Key decodes msg's key with the topic's key codec: the typed key of a
// message this topic delivered, for handlers that need it as a K rather
// than as [Message.Key]'s bytes. A keyless message ([Topic.PublishValue])
// has no key: Key returns the zero K and an error wrapping [ErrInvalid]. It
// does not block.
func (t *Topic[K, V]) Key(msg Message[V]) (K, error) {
	var zero K
	if msg.Key == nil {
		return zero, fmt.Errorf("logbus: key of topic %q partition %d offset %d: %w: the message has no key",
			t.Name(), msg.Partition, msg.Offset, ErrInvalid)
	}
	k, err := t.keys.Decode(msg.Key)
	if err != nil {
		return zero, fmt.Errorf("logbus: key of topic %q partition %d offset %d: %w: %w",
			t.Name(), msg.Partition, msg.Offset, ErrInvalid, err)
	}
	return k, nil
}
