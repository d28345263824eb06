package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ---- helpers shared by the test files of this package ----

// The broker (pubsubtest.NewBroker) and the barrier (pubsubtest.Drain)
// are pubsubtest's; what follows is what pubsubtest has no need to export.

// newTopic is the pair most tests begin with: a broker closed when the
// test ends (pubsubtest.NewBroker, with the defaults) and a topic of
// string keys and values on it called name, made with opts. Call it
// inside a synctest bubble with the bubble's t.
func newTopic(t *testing.T, name string, opts ...pubsub.TopicOption) (*pubsub.Broker, *pubsub.Topic[string, string]) {
	t.Helper()
	b := pubsubtest.NewBroker(t)
	return b, mustTopic(t, b, name, codec.String(), codec.String(), opts...)
}

func mustTopic[K, V any](t *testing.T, b *pubsub.Broker, name string, keys codec.Codec[K], values codec.Codec[V], opts ...pubsub.TopicOption) *pubsub.Topic[K, V] {
	t.Helper()
	topic, err := pubsub.NewTopic(b, name, keys, values, opts...)
	if err != nil {
		t.Fatalf("NewTopic(%q): got error %v, want nil", name, err)
	}
	return topic
}

func mustPublish[K, V any](t *testing.T, topic *pubsub.Topic[K, V], key K, value V, opts ...pubsub.PublishOption) pubsub.Position {
	t.Helper()
	pos, err := topic.Publish(context.Background(), key, value, opts...)
	if err != nil {
		t.Fatalf("Publish(%v, %v): got error %v, want nil", key, value, err)
	}
	return pos
}

func mustPublishValue[K, V any](t *testing.T, topic *pubsub.Topic[K, V], value V, opts ...pubsub.PublishOption) pubsub.Position {
	t.Helper()
	pos, err := topic.PublishValue(context.Background(), value, opts...)
	if err != nil {
		t.Fatalf("PublishValue(%v): got error %v, want nil", value, err)
	}
	return pos
}

func mustSubscribe[K, V any](t *testing.T, topic *pubsub.Topic[K, V], group, consumer string, h pubsub.Handler[V], opts ...pubsub.SubscribeOption) *pubsub.Group[V] {
	t.Helper()
	g, err := topic.Subscribe(group, consumer, h, opts...)
	if err != nil {
		t.Fatalf("Subscribe(%q, %q): got error %v, want nil", group, consumer, err)
	}
	return g
}

func mustStream[K, V any](t *testing.T, topic *pubsub.Topic[K, V], group, consumer string, opts ...pubsub.SubscribeOption) *pubsub.Stream[V] {
	t.Helper()
	s, err := topic.Stream(group, consumer, opts...)
	if err != nil {
		t.Fatalf("Stream(%q, %q): got error %v, want nil", group, consumer, err)
	}
	return s
}

// drainHour is pubsubtest.Drain allowing an hour of virtual time instead
// of a minute, for the scenarios whose backoffs or batch waits are longer.
func drainHour(t *testing.T, b *pubsub.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatalf("Drain: got error %v, want nil", err)
	}
}

func wantErrIs(t *testing.T, what string, err error, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("%s: got error %v, want one wrapping %v", what, err, target)
		}
	}
}

// recorder is a Handler that remembers every call, in order, and fails or
// panics on demand through fail (called after the call is recorded). It is
// not pubsubtest.Recorder, which keeps only the acked messages and whose
// failure function sees no ctx: the tests here count failed attempts too.
type recorder[V any] struct {
	mu   sync.Mutex
	msgs []pubsub.Message[V]
	fail func(ctx context.Context, msg pubsub.Message[V]) error
}

func (r *recorder[V]) Handle(ctx context.Context, msg pubsub.Message[V]) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	fail := r.fail
	r.mu.Unlock()
	if fail != nil {
		return fail(ctx, msg)
	}
	return nil
}

func (r *recorder[V]) calls() []pubsub.Message[V] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

func (r *recorder[V]) values() []V {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]V, len(r.msgs))
	for i, m := range r.msgs {
		out[i] = m.Value
	}
	return out
}

// seqIDs hands out "msg-1", "msg-2", ...
type seqIDs struct{ n atomic.Int64 }

func (s *seqIDs) NextID() string { return fmt.Sprintf("msg-%d", s.n.Add(1)) }

// partitionerFunc adapts a function to a Partitioner.
type partitionerFunc func(key []byte, partitions int) int

func (f partitionerFunc) Partition(key []byte, partitions int) int { return f(key, partitions) }

var (
	errUnencodable = errors.New("test: cannot encode this value")
	errPoison      = errors.New("test: poison bytes")
	errBoom        = errors.New("test: boom")
)

// pickyStrings is a string codec whose Encode fails for "unencodable" and
// whose Decode fails for the bytes "poison".
func pickyStrings() codec.Codec[string] {
	return codec.Func(
		func(v string) ([]byte, error) {
			if v == "unencodable" {
				return nil, errUnencodable
			}
			return []byte(v), nil
		},
		func(data []byte) (string, error) {
			if string(data) == "poison" {
				return "", errPoison
			}
			return string(data), nil
		})
}

func crc32IEEE(s string) uint32 { return crc32.ChecksumIEEE([]byte(s)) }

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// ---- behaviour through the typed API ----

// A record whose value the codec cannot decode never reaches the handler:
// it is dead-lettered after one attempt with a *DecodeError.
func TestUndecodableValueIsDeadLetteredAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 5}))
		topic := mustTopic(t, b, "orders", codec.String(), pickyStrings())
		var rec recorder[string]
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		mustPublishValue(t, topic, "ok-1")
		poison := mustPublishValue(t, topic, "poison")
		mustPublishValue(t, topic, "ok-2")
		pubsubtest.Drain(t, b)

		if got, want := rec.values(), []string{"ok-1", "ok-2"}; !slices.Equal(got, want) {
			t.Errorf("handler saw %q, want %q: the undecodable record must never reach it", got, want)
		}
		letters := g.DeadLetters()
		if len(letters) != 1 {
			t.Fatalf("got %d dead letters, want 1", len(letters))
		}
		dl := letters[0]
		if dl.Attempts != 1 {
			t.Errorf("dead letter Attempts: got %d, want 1 (decode errors are not retried)", dl.Attempts)
		}
		if dl.Message.Offset != poison.Offset || dl.Message.Partition != poison.Partition || dl.Message.Value != "" {
			t.Errorf("dead letter message: got partition %d offset %d value %q, want partition %d offset %d value \"\"",
				dl.Message.Partition, dl.Message.Offset, dl.Message.Value, poison.Partition, poison.Offset)
		}
		wantErrIs(t, "dead letter Err", dl.Err, codec.ErrDecode, errPoison, pubsub.ErrPermanent)
		de, ok := errors.AsType[*pubsub.DecodeError](dl.Err)
		if !ok {
			t.Fatalf("dead letter Err: got %T (%v), want a *pubsub.DecodeError", dl.Err, dl.Err)
		}
		if de.Topic != "orders" || de.Partition != poison.Partition || de.Offset != poison.Offset {
			t.Errorf("DecodeError: got topic %q partition %d offset %d, want %q %d %d",
				de.Topic, de.Partition, de.Offset, "orders", poison.Partition, poison.Offset)
		}
		if !errors.Is(de.Err, codec.ErrDecode) {
			t.Errorf("DecodeError.Err: got %v, want the codec's error (wrapping codec.ErrDecode)", de.Err)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2, DeadLettered: 1}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
		if lag := g.Lag(); lag != 0 {
			t.Errorf("lag: got %d, want 0", lag)
		}
	})
}

// A Stream never sees an undecodable record either.
func TestUndecodableValueNeverReachesAStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), pickyStrings())
		s := mustStream(t, topic, "billing", "s1")
		mustPublishValue(t, topic, "poison")
		mustPublishValue(t, topic, "ok")
		d := recv(t, s)
		if d.Value != "ok" || d.Offset != 1 {
			t.Errorf("first delivery: got %q at offset %d, want \"ok\" at offset 1", d.Value, d.Offset)
		}
		d.Ack()
		pubsubtest.Drain(t, b)
		letters := s.Group().DeadLetters()
		if len(letters) != 1 || letters[0].Attempts != 1 || !errors.Is(letters[0].Err, codec.ErrDecode) {
			t.Fatalf("dead letters: got %+v, want one after 1 attempt wrapping codec.ErrDecode", letters)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close: got %v, want nil", err)
		}
	})
}

// A value (or key) the codec cannot encode fails Publish with the codec's
// error, and appends nothing: the next record takes the offset.
func TestUnencodableFailsPublishAndAppendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", pickyStrings(), pickyStrings())
		var rec recorder[string]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		if pos := mustPublish(t, topic, "k", "first"); pos.Offset != 0 {
			t.Fatalf("first publish: got offset %d, want 0", pos.Offset)
		}

		_, err := topic.Publish(context.Background(), "k", "unencodable")
		wantErrIs(t, "Publish of an unencodable value", err, codec.ErrEncode, errUnencodable)
		_, err = topic.PublishValue(context.Background(), "unencodable")
		wantErrIs(t, "PublishValue of an unencodable value", err, codec.ErrEncode, errUnencodable)
		_, err = topic.Publish(context.Background(), "unencodable", "fine")
		wantErrIs(t, "Publish with an unencodable key", err, codec.ErrEncode, errUnencodable)

		if got := topic.Stats().Published; got != 1 {
			t.Errorf("Published after the failed publishes: got %d, want 1", got)
		}
		if pos := mustPublish(t, topic, "k", "second"); pos.Offset != 1 {
			t.Errorf("next publish: got offset %d, want 1 (the failed ones took none)", pos.Offset)
		}
		pubsubtest.Drain(t, b)
		if got, want := rec.values(), []string{"first", "second"}; !slices.Equal(got, want) {
			t.Errorf("delivered %q, want %q", got, want)
		}
	})
}

// WithHeaders copies the map: changing it after Publish changes nothing.
func TestHeadersAreCopiedOnPublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		var rec recorder[string]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		h := map[string]string{"trace": "abc", "tenant": "t1"}
		mustPublish(t, topic, "alice", "paid", pubsub.WithHeaders(h))
		// Mutate the caller's map right away, while the worker may be reading
		// the record: the race detector would flag a shared map.
		h["trace"] = "changed"
		h["extra"] = "added"
		delete(h, "tenant")
		pubsubtest.Drain(t, b)
		calls := rec.calls()
		if len(calls) != 1 {
			t.Fatalf("got %d deliveries, want 1", len(calls))
		}
		if got, want := calls[0].Headers, map[string]string{"trace": "abc", "tenant": "t1"}; !maps.Equal(got, want) {
			t.Errorf("delivered headers: got %v, want %v", got, want)
		}
	})
}

// Keys a handler keeps stay as they were delivered, however many keys are
// delivered after them and whatever the handler does to them: appending to
// one never writes into the next one's memory.
func TestKeptKeysStayIntact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(2))
		var mu sync.Mutex
		kept := map[int][]byte{}
		mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[int](func(_ context.Context, msg pubsub.Message[int]) error {
			grown := append(msg.Key, "-and-more-bytes"...) // must not spill into a neighbour
			grown[0] = '#'
			mu.Lock()
			defer mu.Unlock()
			kept[msg.Value] = msg.Key
			return nil
		}))
		const n = 500 // keys of 9–11 bytes: many per shared allocation
		for i := range n {
			mustPublish(t, topic, fmt.Sprintf("customer-%d", i), i)
		}
		pubsubtest.Drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		if len(kept) != n {
			t.Fatalf("kept %d keys, want %d", len(kept), n)
		}
		for i, key := range kept {
			if want := fmt.Sprintf("customer-%d", i); string(key) != want {
				t.Errorf("kept key of value %d reads %q, want %q", i, key, want)
			}
		}
	})
}

// The default clock stamps a record with time.Now as of the last
// millisecond tick while records flow, and reads time.Now afresh after a
// pause. In a bubble time is virtual, so each stamp is exact.
func TestDefaultClockStampsToTheMillisecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		rec := &recorder[string]{}
		mustSubscribe(t, topic, "g", "c", rec)
		start := time.Now()
		mustPublishValue(t, topic, "first")
		time.Sleep(time.Millisecond / 2) // virtual time, in the bubble
		mustPublishValue(t, topic, "within the millisecond")
		time.Sleep(5 * time.Millisecond) // virtual: long enough for the refresh goroutine to stop
		mustPublishValue(t, topic, "after a pause")
		pubsubtest.Drain(t, b)
		want := []time.Duration{0, 0, 5*time.Millisecond + time.Millisecond/2}
		calls := rec.calls()
		if len(calls) != len(want) {
			t.Fatalf("got %d deliveries, want %d", len(calls), len(want))
		}
		for i, msg := range calls {
			if got := msg.Created.Sub(start); got != want[i] {
				t.Errorf("%q: Created %v after the first publish, want %v", msg.Value, got, want[i])
			}
		}
	})
}

// A new record is encoded into the buffers of one the topic reclaimed
// (codec.Appender), so what outlives a record must not share its bytes: a
// dead letter, a value or key a handler kept.
func TestWhatOutlivesARecordKeepsItsBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.Bytes(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2}))
		g := mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[[]byte](func(_ context.Context, msg pubsub.Message[[]byte]) error {
			if string(msg.Value) == "poison-000" {
				return pubsub.ErrPermanent
			}
			return nil
		}))
		var mu sync.Mutex
		var keys, values [][]byte // as delivered, read again at the end
		mustSubscribe(t, topic, "keeper", "c", pubsub.HandlerFunc[[]byte](func(_ context.Context, msg pubsub.Message[[]byte]) error {
			mu.Lock()
			defer mu.Unlock()
			keys, values = append(keys, msg.Key), append(values, msg.Value)
			return nil
		}))
		const n = 100 // equal lengths, so every record fits the buffers it reuses
		mustPublish(t, topic, "key-000", []byte("poison-000"))
		for i := 1; i <= n; i++ {
			mustPublish(t, topic, fmt.Sprintf("key-%03d", i), fmt.Appendf(nil, "value-%03d", i))
		}
		pubsubtest.Drain(t, b)
		if got := topic.Stats().Reclaimed; got < n-1 {
			t.Fatalf("reclaimed %d records, want at least %d: the test needs reuse", got, n-1)
		}
		letters := g.DeadLetters()
		if len(letters) != 1 {
			t.Fatalf("got %d dead letters, want 1", len(letters))
		}
		if got := letters[0].Message; string(got.Key) != "key-000" || string(got.Value) != "poison-000" {
			t.Errorf("dead letter reads key %q value %q, want \"key-000\" \"poison-000\"", got.Key, got.Value)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(keys) != n+1 {
			t.Fatalf("keeper kept %d records, want %d", len(keys), n+1)
		}
		for i := range keys {
			wantKey, wantValue := fmt.Sprintf("key-%03d", i), fmt.Sprintf("value-%03d", i)
			if i == 0 {
				wantValue = "poison-000"
			}
			if string(keys[i]) != wantKey || string(values[i]) != wantValue {
				t.Errorf("record %d reads key %q value %q now, want %q %q", i, keys[i], values[i], wantKey, wantValue)
			}
		}
	})
}

// With codec.RawBytes a handler reads the log's own bytes: every group gets
// the same memory for a record, and what it reads during the call is the
// record's value even though the log reuses its buffers for later records.
// A dead letter's Value is the caller's own even so.
func TestRawBytesHandsOutTheLogsBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.RawBytes(),
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2}))
		const n = 100 // equal lengths, so every record fits the buffer it reuses
		want := func(offset int64) string { return fmt.Sprintf("value-%03d", offset) }
		var mu sync.Mutex
		first := map[string][]*byte{} // per group, where each record's first byte was
		handler := func(group string) pubsub.HandlerFunc[[]byte] {
			return func(_ context.Context, msg pubsub.Message[[]byte]) error {
				if got := string(msg.Value); got != want(msg.Offset) {
					t.Errorf("%s: offset %d reads %q during its delivery, want %q", group, msg.Offset, got, want(msg.Offset))
				}
				mu.Lock()
				first[group] = append(first[group], &msg.Value[0])
				mu.Unlock()
				if group == "billing" && msg.Offset == 0 {
					return pubsub.ErrPermanent
				}
				return nil
			}
		}
		billing := mustSubscribe(t, topic, "billing", "c", handler("billing"))
		mustSubscribe(t, topic, "audit", "c", handler("audit"))
		for i := range int64(n) {
			mustPublishValue(t, topic, []byte(want(i)))
		}
		pubsubtest.Drain(t, b)
		if got := topic.Stats().Reclaimed; got < n-2 {
			t.Fatalf("reclaimed %d records, want at least %d: the test needs reuse", got, n-2)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(first["billing"]) != n || len(first["audit"]) != n {
			t.Fatalf("delivered %d and %d records, want %d each", len(first["billing"]), len(first["audit"]), n)
		}
		for i := range n {
			if first["billing"][i] != first["audit"][i] {
				t.Fatalf("offset %d: the groups got different memory; RawBytes should hand out the log's bytes", i)
			}
		}

		letters := billing.DeadLetters()
		if len(letters) != 1 || string(letters[0].Message.Value) != want(0) {
			t.Fatalf("dead letters: %+v, want one reading %q", letters, want(0))
		}
		copy(letters[0].Message.Value, "XXXXX")
		if got := string(billing.DeadLetters()[0].Message.Value); got != want(0) {
			t.Errorf("after the caller wrote to its dead letter's Value, the letter reads %q, want %q", got, want(0))
		}
	})
}

// Key, Headers and Value are each consumer's own copies: what one group's
// handler does to them is not seen by another group, nor by its own next
// delivery of the record.
func TestHandlerMutationsStayInItsGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.Bytes())

		// seen records, per group, how each delivery looked when it arrived.
		var mu sync.Mutex
		seen := map[string][]string{}
		look := func(group string, msg pubsub.Message[[]byte]) {
			mu.Lock()
			defer mu.Unlock()
			seen[group] = append(seen[group], fmt.Sprintf("key=%q value=%q headers=%v", msg.Key, msg.Value, msg.Headers))
		}
		mutated := make(chan struct{})
		var once sync.Once
		vandal := pubsub.HandlerFunc[[]byte](func(_ context.Context, msg pubsub.Message[[]byte]) error {
			look("vandal", msg)
			msg.Headers["trace"] = "mutated"
			msg.Headers["added"] = "1"
			msg.Key[0] = 'X'
			msg.Value[0] = 'X'
			once.Do(func() { close(mutated) })
			return nil
		})
		// The observer looks only after the vandal has done its worst.
		observer := pubsub.HandlerFunc[[]byte](func(_ context.Context, msg pubsub.Message[[]byte]) error {
			<-mutated
			look("observer", msg)
			return nil
		})
		vg := mustSubscribe(t, topic, "vandal", "v1", vandal)
		mustSubscribe(t, topic, "observer", "o1", observer)
		mustPublish(t, topic, "alice", []byte("paid"), pubsub.WithHeaders(map[string]string{"trace": "abc"}))
		pubsubtest.Drain(t, b)
		// The vandal's own next delivery of the record is untouched too.
		if err := vg.Replay(context.Background(), pubsub.AtOffset(0)); err != nil {
			t.Fatalf("Replay(0): got %v, want nil", err)
		}
		pubsubtest.Drain(t, b)

		pristine := fmt.Sprintf("key=%q value=%q headers=%v", "alice", "paid", map[string]string{"trace": "abc"})
		mu.Lock()
		defer mu.Unlock()
		for group, n := range map[string]int{"vandal": 2, "observer": 1} {
			if got := seen[group]; len(got) != n {
				t.Errorf("%s: got %d deliveries, want %d", group, len(got), n)
			}
			for i, got := range seen[group] {
				if got != pristine {
					t.Errorf("%s delivery #%d: got %s, want %s", group, i+1, got, pristine)
				}
			}
		}
	})
}

// Message.Attempt is 1 on the first delivery and counts up on each retry;
// the ID stays the same; the backoff is BaseDelay doubling.
func TestAttemptCountsUpOnRedelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 4, BaseDelay: 10 * time.Millisecond}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		rec := &recorder[string]{fail: func(_ context.Context, msg pubsub.Message[string]) error {
			if msg.Attempt < 3 {
				return errBoom
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "billing", "b1", rec)
		start := time.Now()
		mustPublishValue(t, topic, "job")
		pubsubtest.Drain(t, b)
		if got, want := time.Since(start), 30*time.Millisecond; got != want {
			t.Errorf("acked after %v of virtual time, want %v (10ms then 20ms of backoff)", got, want)
		}
		calls := rec.calls()
		var attempts []int
		for _, m := range calls {
			attempts = append(attempts, m.Attempt)
			if m.ID != calls[0].ID || m.Offset != 0 {
				t.Errorf("redelivery: got ID %q offset %d, want ID %q offset 0", m.ID, m.Offset, calls[0].ID)
			}
		}
		if want := []int{1, 2, 3}; !slices.Equal(attempts, want) {
			t.Errorf("attempts: got %v, want %v", attempts, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1, Retried: 2}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
	})
}

// A record that keeps failing is dead-lettered after MaxAttempts, and the
// partition moves on.
func TestRetriesThenDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := pubsubtest.NewClock(epoch)
		b := pubsubtest.NewBroker(t, pubsub.WithClock(clock))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		rec := &recorder[string]{fail: func(_ context.Context, msg pubsub.Message[string]) error {
			if msg.Value == "bad" {
				return fmt.Errorf("order %s: %w", msg.Value, errBoom)
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "billing", "b1", rec, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second}))
		mustPublishValue(t, topic, "bad")
		mustPublishValue(t, topic, "good")
		pubsubtest.Drain(t, b)
		if got, want := rec.values(), []string{"bad", "bad", "bad", "good"}; !slices.Equal(got, want) {
			t.Errorf("handler calls: got %q, want %q", got, want)
		}
		letters := g.DeadLetters()
		if len(letters) != 1 {
			t.Fatalf("got %d dead letters, want 1", len(letters))
		}
		dl := letters[0]
		if dl.Attempts != 3 || dl.Message.Value != "bad" || dl.Message.Offset != 0 || !dl.FailedAt.Equal(epoch) {
			t.Errorf("dead letter: got value %q offset %d after %d attempts at %v, want \"bad\" offset 0 after 3 at %v",
				dl.Message.Value, dl.Message.Offset, dl.Attempts, dl.FailedAt, epoch)
		}
		wantErrIs(t, "dead letter Err", dl.Err, errBoom)
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1, Retried: 2, DeadLettered: 1}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
	})
}

// An error wrapping ErrPermanent is dead-lettered after one attempt.
func TestPermanentErrorSkipsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t, pubsub.WithRetry(pubsub.RetryPolicy{MaxAttempts: 5}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String())
		rec := &recorder[string]{fail: func(_ context.Context, msg pubsub.Message[string]) error {
			return fmt.Errorf("order %s: unknown currency: %w", msg.Value, pubsub.ErrPermanent)
		}}
		g := mustSubscribe(t, topic, "billing", "b1", rec)
		mustPublishValue(t, topic, "x")
		pubsubtest.Drain(t, b)
		if n := len(rec.calls()); n != 1 {
			t.Errorf("handler calls: got %d, want 1", n)
		}
		letters := g.DeadLetters()
		if len(letters) != 1 || letters[0].Attempts != 1 {
			t.Fatalf("dead letters: got %+v, want one after 1 attempt", letters)
		}
		wantErrIs(t, "dead letter Err", letters[0].Err, pubsub.ErrPermanent)
		if got, want := g.Stats(), (pubsub.GroupStats{DeadLettered: 1}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
	})
}

// A handler panic becomes a *PanicError in the dead letter, and the worker
// goes on with the next record.
func TestHandlerPanicBecomesPanicError(t *testing.T) {
	tests := []struct {
		name     string
		panicVal any
		wantIs   error // nil: the panic value is not an error
	}{
		{"string value", "kaboom", nil},
		{"error value", errBoom, errBoom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, topic := newTopic(t, "orders")
				rec := &recorder[string]{fail: func(_ context.Context, msg pubsub.Message[string]) error {
					if msg.Value == "boom" {
						panic(tt.panicVal)
					}
					return nil
				}}
				g := mustSubscribe(t, topic, "billing", "b1", rec, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 2}))
				mustPublishValue(t, topic, "boom")
				mustPublishValue(t, topic, "after")
				pubsubtest.Drain(t, b)
				if got, want := rec.values(), []string{"boom", "boom", "after"}; !slices.Equal(got, want) {
					t.Errorf("handler calls: got %q, want %q (the worker must survive the panic)", got, want)
				}
				letters := g.DeadLetters()
				if len(letters) != 1 {
					t.Fatalf("got %d dead letters, want 1", len(letters))
				}
				pe, ok := errors.AsType[*pubsub.PanicError](letters[0].Err)
				if !ok {
					t.Fatalf("dead letter Err: got %T (%v), want a *pubsub.PanicError", letters[0].Err, letters[0].Err)
				}
				if pe.Value != tt.panicVal || len(pe.Stack) == 0 {
					t.Errorf("PanicError: got value %v and %d bytes of stack, want value %v and a stack", pe.Value, len(pe.Stack), tt.panicVal)
				}
				if tt.wantIs != nil && !errors.Is(letters[0].Err, tt.wantIs) {
					t.Errorf("dead letter Err: got %v, want it to wrap the panicked error %v", letters[0].Err, tt.wantIs)
				}
				if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1, Retried: 1, DeadLettered: 1}); got != want {
					t.Errorf("stats: got %+v, want %+v", got, want)
				}
			})
		})
	}
}

// Every Message field, with an injected clock and ID source.
func TestMessageFields(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := pubsubtest.NewClock(epoch)
		b := pubsubtest.NewBroker(t, pubsub.WithClock(clock), pubsub.WithIDs(&seqIDs{}))
		topic := mustTopic(t, b, "orders", codec.String(), codec.String(),
			pubsub.WithPartitions(2), pubsub.WithPartitioner(pubsub.RoundRobin()))

		type sent struct {
			pos     pubsub.Position
			key     []byte // nil: keyless
			created time.Time
		}
		want := map[string]sent{}
		pos := mustPublishValue(t, topic, "v1")
		want["v1"] = sent{pos, nil, epoch}
		clock.Advance(time.Second)
		pos = mustPublish(t, topic, "alice", "v2")
		want["v2"] = sent{pos, []byte("alice"), epoch.Add(time.Second)}
		clock.Advance(time.Second)
		pos = mustPublish(t, topic, "", "v3") // keyed, with a key that encodes to nothing
		want["v3"] = sent{pos, []byte{}, epoch.Add(2 * time.Second)}
		clock.Advance(time.Second)
		pos = mustPublishValue(t, topic, "v4")
		want["v4"] = sent{pos, nil, epoch.Add(3 * time.Second)}

		wantPos := []pubsub.Position{{0, 0}, {1, 0}, {0, 1}, {1, 1}} // round robin
		for i, v := range []string{"v1", "v2", "v3", "v4"} {
			if want[v].pos != wantPos[i] {
				t.Errorf("Publish(%s) position: got %+v, want %+v", v, want[v].pos, wantPos[i])
			}
		}

		var rec recorder[string]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		pubsubtest.Drain(t, b)
		calls := rec.calls()
		if len(calls) != 4 {
			t.Fatalf("got %d deliveries, want 4", len(calls))
		}
		ids := map[string]bool{}
		for _, m := range calls {
			w, ok := want[m.Value]
			if !ok {
				t.Errorf("delivered value: got %q, want one of v1..v4", m.Value)
				continue
			}
			if wantID := "msg-" + m.Value[1:]; m.ID != wantID {
				t.Errorf("%s: ID got %q, want %q from the injected IDSource", m.Value, m.ID, wantID)
			}
			ids[m.ID] = true
			if m.Topic != "orders" {
				t.Errorf("%s: Topic got %q, want %q", m.Value, m.Topic, "orders")
			}
			if m.Partition != w.pos.Partition || m.Offset != w.pos.Offset {
				t.Errorf("%s: got partition %d offset %d, want %d %d (what Publish returned)", m.Value, m.Partition, m.Offset, w.pos.Partition, w.pos.Offset)
			}
			switch {
			case w.key == nil && m.Key != nil:
				t.Errorf("%s: Key got %q, want nil for a keyless record", m.Value, m.Key)
			case w.key != nil && (m.Key == nil || string(m.Key) != string(w.key)):
				t.Errorf("%s: Key got %#v, want %#v (non-nil: the record is keyed)", m.Value, m.Key, w.key)
			}
			if !m.Created.Equal(w.created) {
				t.Errorf("%s: Created got %v, want %v from the injected clock", m.Value, m.Created, w.created)
			}
			if m.Attempt != 1 {
				t.Errorf("%s: Attempt got %d, want 1", m.Value, m.Attempt)
			}
		}
		if len(ids) != 4 {
			t.Errorf("got %d distinct IDs over 4 records, want 4", len(ids))
		}
	})
}

// Every group sees a record under the same default ID, and records of two
// topics with the same partition and offset have different IDs.
func TestDefaultIDsAreTheSameForEveryGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		var mu sync.Mutex
		seen := map[string]map[string]string{} // group -> "topic/offset" -> ID
		for _, name := range []string{"a", "b"} {
			topic := mustTopic(t, b, name, codec.String(), codec.Int[int]())
			for _, group := range []string{"g1", "g2"} {
				mustSubscribe(t, topic, group, "c", pubsub.HandlerFunc[int](func(_ context.Context, msg pubsub.Message[int]) error {
					mu.Lock()
					defer mu.Unlock()
					if seen[group] == nil {
						seen[group] = map[string]string{}
					}
					seen[group][fmt.Sprintf("%s/%d", msg.Topic, msg.Offset)] = msg.ID
					return nil
				}))
			}
			for i := range 150 { // more than one block of IDs
				if _, err := topic.PublishValue(context.Background(), i); err != nil {
					t.Fatalf("PublishValue: got %v, want nil", err)
				}
			}
		}
		pubsubtest.Drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		if len(seen["g1"]) != 300 || !maps.Equal(seen["g1"], seen["g2"]) {
			t.Fatalf("g1 saw %d records, g2 %d; want the same 300 records under the same IDs", len(seen["g1"]), len(seen["g2"]))
		}
		distinct := map[string]bool{}
		for _, id := range seen["g1"] {
			distinct[id] = true
		}
		if len(distinct) != 300 {
			t.Errorf("got %d distinct IDs over 300 records of two topics, want 300", len(distinct))
		}
	})
}

// The default IDs are non-empty and unique, within a broker and across two.
func TestDefaultIDsAreUniqueAcrossBrokers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		ids := map[string]int{}
		for range 2 {
			b := pubsubtest.NewBroker(t)
			topic := mustTopic(t, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(3))
			mustSubscribe(t, topic, "g", "c", pubsub.HandlerFunc[int](func(_ context.Context, msg pubsub.Message[int]) error {
				mu.Lock()
				defer mu.Unlock()
				ids[msg.ID]++
				return nil
			}))
			var wg sync.WaitGroup
			for p := range 4 {
				wg.Go(func() {
					for i := range 25 {
						if _, err := topic.PublishValue(context.Background(), p*25+i); err != nil {
							t.Errorf("PublishValue: got %v, want nil", err)
						}
					}
				})
			}
			wg.Wait()
			pubsubtest.Drain(t, b)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(ids) != 200 {
			t.Errorf("got %d distinct IDs over 200 records, want 200", len(ids))
		}
		for id, n := range ids {
			if id == "" || n != 1 {
				t.Errorf("ID %q seen %d times, want a non-empty ID seen once", id, n)
			}
		}
	})
}

// Subscribe to an existing group returns the same *Group, and the options
// of every call but the first are ignored.
func TestSubscribeSameGroupReturnsSameGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders", pubsub.WithPartitions(2))
		perm := &recorder[string]{fail: func(context.Context, pubsub.Message[string]) error { return pubsub.ErrPermanent }}
		g1 := mustSubscribe(t, topic, "billing", "b1", perm)
		// Options that differ from the group's are refused, never ignored,
		// and the refused consumer is not in the group.
		for _, opt := range []pubsub.SubscribeOption{pubsub.WithDeadLetterLimit(1), pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5}), pubsub.StartAt(pubsub.Latest())} {
			if _, err := topic.Subscribe("billing", "b2", perm, opt); !errors.Is(err, pubsub.ErrSubscription) {
				t.Errorf("Subscribe to billing with an option it was not created with: got %v, want ErrSubscription", err)
			}
		}
		if _, err := topic.Stream("billing", "b2", pubsub.WithDeadLetterLimit(1)); !errors.Is(err, pubsub.ErrSubscription) {
			t.Errorf("Stream on billing with an option it was not created with: got %v, want ErrSubscription", err)
		}
		if asg := g1.Assignment(); len(asg) != 1 {
			t.Errorf("assignment after refused joins: got %v, want b1 alone", asg)
		}
		g2 := mustSubscribe(t, topic, "billing", "b2", perm)
		s := mustStream(t, topic, "billing", "b3")
		audit := mustSubscribe(t, topic, "audit", "a1", &recorder[string]{})
		if g1 != g2 {
			t.Errorf("second Subscribe to billing: got *Group %p, want the first's %p", g2, g1)
		}
		if s.Group() != g1 {
			t.Errorf("Stream on billing: Group() got %p, want %p", s.Group(), g1)
		}
		if audit == g1 {
			t.Errorf("Subscribe to audit: got billing's *Group %p, want a different one", audit)
		}
		if g1.Name() != "billing" || audit.Name() != "audit" {
			t.Errorf("names: got %q and %q, want billing and audit", g1.Name(), audit.Name())
		}
		asg := g1.Assignment()
		if len(asg) != 3 || len(asg["b1"])+len(asg["b2"]) != 2 || len(asg["b3"]) != 0 {
			t.Errorf("assignment: got %v, want b1 and b2 owning one partition each and b3 none", asg)
		}
		mustPublishValue(t, topic, "x")
		mustPublishValue(t, topic, "y")
		pubsubtest.Drain(t, b)
		if got := len(g1.DeadLetters()); got != 2 {
			t.Errorf("dead letters kept: got %d, want 2 (the default limit, which the refused option did not change)", got)
		}
		if got := g1.Stats().DeadLettersEvicted; got != 0 {
			t.Errorf("DeadLettersEvicted: got %d, want 0", got)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close: got %v, want nil", err)
		}
	})
}

// Default returns one broker, from any goroutine.
//
// Unlike the other tests this one runs outside a synctest bubble, as the
// Default documentation requires: the process-wide broker outlives the test,
// so its channels must not belong to a bubble. The goroutines involve no
// time and are joined before the test ends. The broker has no goroutines of
// its own until something subscribes, and nothing does, so goleak is
// satisfied without closing it (closing it would leave later runs under
// -count a stopped Default).
func TestDefaultIsOneBroker(t *testing.T) {
	got := make([]*pubsub.Broker, 16)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i] = pubsub.Default() })
	}
	wg.Wait()
	first := got[0]
	if first == nil {
		t.Fatal("Default(): got nil, want a broker")
	}
	for i, b := range got {
		if b != first {
			t.Errorf("Default() from goroutine %d: got %p, want %p", i, b, first)
		}
	}
	if again := pubsub.Default(); again != first {
		t.Errorf("Default() again: got %p, want %p", again, first)
	}
	if s := first.State(); s != pubsub.Running {
		t.Errorf("Default().State(): got %v, want %v", s, pubsub.Running)
	}
	if err := first.Err(); err != nil {
		t.Errorf("Default().Err(): got %v, want nil", err)
	}
	own := pubsub.NewBroker()
	if own == first {
		t.Error("NewBroker returned the Default broker, want a new one")
	}
	if err := own.Close(context.Background()); err != nil {
		t.Errorf("Close of an unused broker: got %v, want nil", err)
	}
}

// DropOldest evicts unread records: the topic counts them as Dropped, and
// the group that had not read them as Skipped.
func TestDropOldestCountsDroppedAndSkipped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest}))
		gate := make(chan struct{})
		rec := &recorder[string]{fail: func(_ context.Context, msg pubsub.Message[string]) error {
			if msg.Value == "v0" {
				<-gate
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "slow", "s1", rec)
		mustPublishValue(t, topic, "v0")
		synctest.Wait() // the group is inside the handler for v0
		start := time.Now()
		for _, v := range []string{"v1", "v2", "v3", "v4"} {
			mustPublishValue(t, topic, v)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("DropOldest publishes waited %v, want 0", waited)
		}
		st := topic.Stats()
		if st.Published != 5 || st.Retained != 2 || st.Dropped != 3 || st.Blocked != 0 {
			t.Errorf("topic stats: got %+v, want Published 5, Retained 2, Dropped 3, Blocked 0", st)
		}
		close(gate)
		pubsubtest.Drain(t, b)
		if got, want := rec.values(), []string{"v0", "v3", "v4"}; !slices.Equal(got, want) {
			t.Errorf("delivered %q, want %q (v1 and v2 were dropped unread)", got, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 3, Skipped: 2}); got != want {
			t.Errorf("group stats: got %+v, want %+v", got, want)
		}
		if lag := g.Lag(); lag != 0 {
			t.Errorf("lag: got %d, want 0", lag)
		}
	})
}

// When Close's context ends while a handler is stuck, Close cancels the
// handlers' context and reports a *ShutdownError naming what was left.
func TestCloseReportsShutdownErrorWhenAHandlerIsStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		var handlerErr atomic.Value
		rec := &recorder[string]{fail: func(ctx context.Context, msg pubsub.Message[string]) error {
			if msg.Value == "stuck" {
				<-ctx.Done()
				handlerErr.Store(ctx.Err())
				return ctx.Err()
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "billing", "b1", rec)
		for _, v := range []string{"ok", "stuck", "never"} {
			mustPublishValue(t, topic, v)
		}
		synctest.Wait()
		if s := b.State(); s != pubsub.Running {
			t.Errorf("state before Close: got %v, want %v", s, pubsub.Running)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		closed := make(chan error, 1)
		go func() { closed <- b.Close(ctx) }()
		synctest.Wait() // Close is draining, waiting for the stuck handler
		if s := b.State(); s != pubsub.Draining {
			t.Errorf("state during Close: got %v, want %v", s, pubsub.Draining)
		}
		_, err := topic.PublishValue(context.Background(), "late")
		wantErrIs(t, "PublishValue while draining", err, pubsub.ErrClosed)

		err = <-closed
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("Close returned after %v, want 5s (its ctx's deadline)", waited)
		}
		se, ok := errors.AsType[*pubsub.ShutdownError](err)
		if !ok {
			t.Fatalf("Close: got %T (%v), want a *pubsub.ShutdownError", err, err)
		}
		want := []pubsub.Unfinished{{Group: "billing", Topic: "orders", Partition: 0, Committed: 1, End: 3}}
		if !slices.Equal(se.Unfinished, want) {
			t.Errorf("Unfinished: got %+v, want %+v", se.Unfinished, want)
		}
		wantErrIs(t, "Close", err, context.DeadlineExceeded)
		if got, _ := handlerErr.Load().(error); !errors.Is(got, context.Canceled) {
			t.Errorf("the stuck handler's ctx.Err(): got %v, want context.Canceled", got)
		}
		if s := b.State(); s != pubsub.Stopped {
			t.Errorf("state after Close: got %v, want %v", s, pubsub.Stopped)
		}
		if got, want := rec.values(), []string{"ok", "stuck"}; !slices.Equal(got, want) {
			t.Errorf("handler calls: got %q, want %q", got, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1}); got != want {
			t.Errorf("stats: got %+v, want %+v (an interrupted delivery is no failure)", got, want)
		}
		if c := g.Committed(0); c != 1 {
			t.Errorf("Committed(0): got %d, want 1", c)
		}
	})
}

// A graceful Close drains first, and moves the state from Running to
// Stopped.
func TestCloseDrainsAndStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		if s := b.State(); s != pubsub.Running || s.String() != "running" {
			t.Errorf("new broker state: got %v, want running", s)
		}
		topic := mustTopic(t, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(3))
		var rec recorder[int]
		g := mustSubscribe(t, topic, "billing", "b1", &rec)
		for i := range 30 {
			mustPublishValue(t, topic, i)
		}
		if err := b.Close(context.Background()); err != nil {
			t.Fatalf("Close: got %v, want nil", err)
		}
		if s := b.State(); s != pubsub.Stopped || s.String() != "stopped" {
			t.Errorf("state after Close: got %v, want stopped", s)
		}
		got := rec.values()
		slices.Sort(got)
		want := make([]int, 30)
		for i := range want {
			want[i] = i
		}
		if !slices.Equal(got, want) {
			t.Errorf("delivered %v, want each of 0..29 once", got)
		}
		if lag := g.Lag(); lag != 0 {
			t.Errorf("lag after Close: got %d, want 0", lag)
		}
	})
}

// Close from many goroutines at once: each returns the one result.
func TestConcurrentClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.String(), codec.Int[int](), pubsub.WithPartitions(4))
		var rec recorder[int]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		for i := range 40 {
			mustPublishValue(t, topic, i)
		}
		errs := make([]error, 8)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = b.Close(context.Background()) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Close #%d: got %v, want nil", i, err)
			}
		}
		if s := b.State(); s != pubsub.Stopped {
			t.Errorf("state: got %v, want %v", s, pubsub.Stopped)
		}
		if n := len(rec.calls()); n != 40 {
			t.Errorf("deliveries: got %d, want 40", n)
		}
	})
}

// Later Close calls wait for the first and return its result, bounded by
// their own context.
func TestLaterCloseReturnsTheFirstResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(ctx context.Context, _ pubsub.Message[string]) error {
			<-ctx.Done()
			return ctx.Err()
		}))
		mustPublishValue(t, topic, "stuck")
		synctest.Wait()

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		first := make(chan error, 1)
		go func() { first <- b.Close(ctx) }()
		synctest.Wait() // the first Close has begun

		impatient, cancelImpatient := context.WithTimeout(context.Background(), time.Second)
		defer cancelImpatient()
		later := make([]error, 3)
		var wg sync.WaitGroup
		for i := range later {
			wg.Go(func() { later[i] = b.Close(context.Background()) })
		}
		err := b.Close(impatient)
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("impatient Close returned after %v, want 1s", waited)
		}
		wantErrIs(t, "impatient Close", err, context.DeadlineExceeded)
		if _, ok := errors.AsType[*pubsub.ShutdownError](err); ok {
			t.Errorf("impatient Close: got a ShutdownError %v, want its own ctx's error", err)
		}

		firstErr := <-first
		wg.Wait()
		if _, ok := errors.AsType[*pubsub.ShutdownError](firstErr); !ok {
			t.Fatalf("first Close: got %v, want a *pubsub.ShutdownError", firstErr)
		}
		for i, err := range later {
			if err != firstErr {
				t.Errorf("later Close #%d: got %v, want the first's result %v", i, err, firstErr)
			}
		}
	})
}

// A record DropOldest evicts while it sits in the worker's batch, before its
// delivery began, is skipped and counted, not delivered.
func TestDropOldestSkipsBatchedRecordsNotYetBegun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest}))
		mustPublishValue(t, topic, "v0")
		mustPublishValue(t, topic, "v1")
		gate := make(chan struct{})
		rec := &recorder[string]{fail: func(_ context.Context, msg pubsub.Message[string]) error {
			if msg.Value == "v0" {
				<-gate
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "slow", "s1", rec)
		synctest.Wait()                  // the worker read v0 and v1, and is inside the handler for v0
		mustPublishValue(t, topic, "v2") // evicts v0, whose delivery began
		mustPublishValue(t, topic, "v3") // evicts v1, whose delivery had not
		close(gate)
		pubsubtest.Drain(t, b)
		if got, want := rec.values(), []string{"v0", "v2", "v3"}; !slices.Equal(got, want) {
			t.Errorf("delivered %q, want %q", got, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 3, Skipped: 1}); got != want {
			t.Errorf("group stats: got %+v, want %+v", got, want)
		}
		if st := topic.Stats(); st.Dropped != 2 || st.Published != 4 || st.Retained != 2 {
			t.Errorf("topic stats: got %+v, want Dropped 2, Published 4, Retained 2", st)
		}
	})
}

// A record DropOldest evicts while it waits out a retry backoff is skipped,
// not retried.
func TestDropOldestSkipsARecordWaitingForRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest}))
		rec := &recorder[string]{fail: func(_ context.Context, msg pubsub.Message[string]) error {
			if msg.Value == "v0" {
				return errBoom
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "billing", "b1", rec, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second}))
		mustPublishValue(t, topic, "v0")
		synctest.Wait() // v0 failed once and waits out its 1s backoff
		mustPublishValue(t, topic, "v1")
		mustPublishValue(t, topic, "v2") // evicts v0
		pubsubtest.Drain(t, b)
		if got, want := rec.values(), []string{"v0", "v1", "v2"}; !slices.Equal(got, want) {
			t.Errorf("handler calls: got %q, want %q (v0 must not be retried once evicted)", got, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2, Retried: 1, Skipped: 1}); got != want {
			t.Errorf("group stats: got %+v, want %+v", got, want)
		}
		if n := len(g.DeadLetters()); n != 0 {
			t.Errorf("dead letters: got %d, want 0", n)
		}
	})
}

// A group created after retention trimmed records starts at the oldest
// retained one: what went before it existed is not counted as skipped.
func TestNewGroupStartsAtTheOldestRetainedRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 2, OnFull: pubsub.DropOldest}))
		for _, v := range []string{"v0", "v1", "v2", "v3", "v4"} {
			mustPublishValue(t, topic, v)
		}
		gate := make(chan struct{})
		rec := &recorder[string]{fail: func(context.Context, pubsub.Message[string]) error {
			<-gate
			return nil
		}}
		g := mustSubscribe(t, topic, "late", "l1", rec)
		if c := g.Committed(0); c != 3 {
			t.Errorf("Committed(0) of the new group: got %d, want 3 (the oldest retained)", c)
		}
		if lag := g.Lag(); lag != 2 {
			t.Errorf("Lag of the new group: got %d, want 2 (the retained records)", lag)
		}
		close(gate)
		pubsubtest.Drain(t, b)
		if got, want := rec.values(), []string{"v3", "v4"}; !slices.Equal(got, want) {
			t.Errorf("delivered %q, want %q", got, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 2}); got != want {
			t.Errorf("group stats: got %+v, want %+v (nothing skipped)", got, want)
		}
	})
}

// A paused group, or one whose consumers all left, cannot drain: Drain
// returns ErrStalled at once, naming it, and Close reports it without
// waiting for its context, wrapping ErrStalled too.
func TestCloseReportsGroupsThatCannotDrain(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, g *pubsub.Group[string])
	}{
		{"paused", func(t *testing.T, g *pubsub.Group[string]) { _ = g.Pause(context.Background()) }},
		{"consumers left", func(t *testing.T, g *pubsub.Group[string]) {
			if err := g.Leave(context.Background(), "b1"); err != nil {
				t.Fatalf("Leave: got %v, want nil", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, topic := newTopic(t, "orders")
				var rec recorder[string]
				g := mustSubscribe(t, topic, "billing", "b1", &rec)
				mustPublishValue(t, topic, "a")
				pubsubtest.Drain(t, b)
				tt.setup(t, g)
				mustPublishValue(t, topic, "b")
				mustPublishValue(t, topic, "c")
				start := time.Now()
				if err := b.Drain(context.Background()); !errors.Is(err, pubsub.ErrStalled) || !strings.Contains(err.Error(), `group "billing"`) {
					t.Errorf("Drain: got %v, want ErrStalled naming billing", err)
				}
				if waited := time.Since(start); waited != 0 {
					t.Errorf("Drain waited %v for a group that cannot drain, want 0", waited)
				}
				if lag := g.Lag(); lag != 2 {
					t.Errorf("Lag: got %d, want 2", lag)
				}
				err := b.Close(context.Background())
				se, ok := errors.AsType[*pubsub.ShutdownError](err)
				if !ok {
					t.Fatalf("Close: got %v, want a *pubsub.ShutdownError", err)
				}
				want := []pubsub.Unfinished{{Group: "billing", Topic: "orders", Partition: 0, Committed: 1, End: 3}}
				if !slices.Equal(se.Unfinished, want) {
					t.Errorf("Unfinished: got %+v, want %+v", se.Unfinished, want)
				}
				if !errors.Is(err, pubsub.ErrStalled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
					t.Errorf("ShutdownError.Err: got %v, want ErrStalled (the context did not end)", se.Err)
				}
				if waited := time.Since(start); waited != 0 {
					t.Errorf("Close took %v, want 0", waited)
				}
				if got := rec.values(); !slices.Equal(got, []string{"a"}) {
					t.Errorf("delivered %q, want [a]", got)
				}
			})
		})
	}
}

// Drain gives up when its context ends, with the context's error, and
// names what was left: it never says nil while a group lags.
func TestDrainHonoursItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		release := make(chan struct{})
		mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
			<-release
			return nil
		}))
		mustPublishValue(t, topic, "slow")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err := b.Drain(ctx)
		wantErrIs(t, "Drain", err, context.DeadlineExceeded)
		if err != nil && !strings.Contains(err.Error(), `group "billing" on topic "orders" lags 1`) {
			t.Errorf("Drain: %v, want it to name billing's lag", err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("Drain returned after %v, want 1s", waited)
		}
		close(release)
		pubsubtest.Drain(t, b)
	})
}

// The dead-letter queue keeps the newest WithDeadLetterLimit letters and
// counts the evicted ones.
func TestDeadLetterLimitEvictsTheOldest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		rec := &recorder[string]{fail: func(context.Context, pubsub.Message[string]) error { return pubsub.ErrPermanent }}
		g := mustSubscribe(t, topic, "billing", "b1", rec, pubsub.WithDeadLetterLimit(2))
		for _, v := range []string{"d0", "d1", "d2"} {
			mustPublishValue(t, topic, v)
		}
		pubsubtest.Drain(t, b)
		var got []string
		for _, dl := range g.DeadLetters() {
			got = append(got, dl.Message.Value)
		}
		if want := []string{"d1", "d2"}; !slices.Equal(got, want) {
			t.Errorf("dead letters: got %q, want %q (oldest first, d0 evicted)", got, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{DeadLettered: 3, DeadLettersEvicted: 1}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
	})
}

// Records with equal keys land in one partition (CRC-32 of the key under
// KeyHash) and reach each group in publish order.
func TestKeyedRecordsKeepTheirOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders", pubsub.WithPartitions(3))
		var rec recorder[string]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		mustSubscribe(t, topic, "billing", "b2", &rec)
		keys := []string{"alice", "bob", "carol", "dave"}
		for i := range 10 {
			for _, k := range keys {
				pos := mustPublish(t, topic, k, fmt.Sprintf("%s-%d", k, i))
				if want := int(crc32IEEE(k) % 3); pos.Partition != want {
					t.Fatalf("key %q: got partition %d, want %d (CRC-32 mod 3)", k, pos.Partition, want)
				}
			}
		}
		pubsubtest.Drain(t, b)
		byKey := map[string][]string{}
		for _, m := range rec.calls() {
			byKey[string(m.Key)] = append(byKey[string(m.Key)], m.Value)
		}
		for _, k := range keys {
			var want []string
			for i := range 10 {
				want = append(want, fmt.Sprintf("%s-%d", k, i))
			}
			if got := byKey[k]; !slices.Equal(got, want) {
				t.Errorf("key %q delivered as %q, want %q", k, got, want)
			}
		}
	})
}

// The built-in partitioners route keyless records as documented.
func TestPartitionersSpreadKeylessRecords(t *testing.T) {
	tests := []struct {
		name string
		p    pubsub.Partitioner
		want []int
	}{
		{"KeyHash is round robin for keyless", pubsub.KeyHash(), []int{0, 1, 2, 0, 1, 2, 0}},
		{"RoundRobin", pubsub.RoundRobin(), []int{0, 1, 2, 0, 1, 2, 0}},
		{"Sticky(2)", pubsub.Sticky(2), []int{0, 0, 1, 1, 2, 2, 0}},
		{"Sticky(0) is Sticky(1)", pubsub.Sticky(0), []int{0, 1, 2, 0, 1, 2, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, topic := newTopic(t, "orders",
					pubsub.WithPartitions(3), pubsub.WithPartitioner(tt.p))
				var got []int
				for i := range len(tt.want) {
					got = append(got, mustPublishValue(t, topic, fmt.Sprint(i)).Partition)
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("partitions: got %v, want %v", got, tt.want)
				}
			})
		})
	}
}

// A producer blocked on a full partition wakes when the oldest record
// becomes older than MaxAge, and its record takes the freed room.
func TestBlockedProducerWakesWhenTheOldestRecordExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The broker reads the wall clock, which is virtual in the bubble.
		_, topic := newTopic(t, "jobs",
			pubsub.WithRetention(pubsub.Retention{MaxMessages: 1, MaxAge: time.Second, BlockTimeout: time.Hour}))
		release := make(chan struct{})
		defer close(release)
		mustSubscribe(t, topic, "workers", "w1", stuckHandler(release)) // commits nothing: only age makes room
		mustPublishValue(t, topic, "j1")
		start := time.Now()
		pos := mustPublishValue(t, topic, "j2")
		if waited := time.Since(start); waited <= time.Second || waited > time.Second+time.Millisecond {
			t.Errorf("the blocked Publish returned after %v, want just over the 1s MaxAge", waited)
		}
		if pos.Offset != 1 {
			t.Errorf("offset: got %d, want 1", pos.Offset)
		}
		st := topic.Stats()
		if st.Expired != 1 || st.Blocked != 1 || st.TimedOut != 0 || st.Retained != 1 {
			t.Errorf("stats: got %+v, want Expired 1, Blocked 1, TimedOut 0, Retained 1", st)
		}
		if st.Published-int64(st.Retained) != st.Reclaimed+st.Dropped+st.Expired {
			t.Errorf("stats: got %+v, want Published − Retained == Reclaimed + Dropped + Expired", st)
		}
	})
}

// Seek interrupts a record waiting out its backoff and delivers it again
// from Attempt 1, with no backoff left to wait.
// TestSeekWaitsForTheDeliveryInFlight: a seek on a running group lets the
// delivery in flight finish and commit first, then moves the cursor, and the
// worker restarts there. (The property suite repositions paused groups
// only; see quiesce there.)
func TestSeekWaitsForTheDeliveryInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		release := make(chan struct{})
		var (
			held atomic.Bool
			mu   sync.Mutex
			seen []string
		)
		g := mustSubscribe(t, topic, "billing", "b1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
			if held.CompareAndSwap(false, true) {
				<-release // the first delivery, of "a", is in flight until released
			}
			mu.Lock()
			seen = append(seen, m.Value)
			mu.Unlock()
			return nil
		}))
		mustPublishValue(t, topic, "a")
		mustPublishValue(t, topic, "b")
		synctest.Wait() // "a" is in its handler
		var seekDone atomic.Bool
		go func() {
			if err := g.Seek(context.Background(), 0, 0); err != nil {
				t.Errorf("Seek(0, 0): %v", err)
			}
			seekDone.Store(true)
		}()
		synctest.Wait()
		if seekDone.Load() {
			t.Fatal("Seek returned while a delivery was in flight")
		}
		close(release)
		synctest.Wait()
		if !seekDone.Load() {
			t.Fatal("Seek did not return once the delivery finished")
		}
		pubsubtest.Drain(t, b)
		mu.Lock()
		defer mu.Unlock()
		// "a" finished in the old epoch; the seek to 0 redelivers it, then "b".
		if want := []string{"a", "a", "b"}; !slices.Equal(seen, want) {
			t.Errorf("deliveries: got %v, want %v", seen, want)
		}
		if got := g.Committed(0); got != 2 {
			t.Errorf("committed %d, want 2", got)
		}
	})
}

func TestSeekRestartsAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, topic := newTopic(t, "orders")
		var calls atomic.Int32
		counted := &recorder[string]{fail: func(context.Context, pubsub.Message[string]) error {
			if calls.Add(1) == 1 {
				return errBoom // only the very first call fails
			}
			return nil
		}}
		g := mustSubscribe(t, topic, "billing", "b1", counted, pubsub.WithGroupRetry(pubsub.RetryPolicy{MaxAttempts: 5, BaseDelay: time.Hour}))
		mustPublishValue(t, topic, "a")
		synctest.Wait() // "a" failed once and waits out an hour
		start := time.Now()
		if err := g.Seek(context.Background(), 0, 0); err != nil {
			t.Fatalf("Seek(0, 0): got %v, want nil", err)
		}
		pubsubtest.Drain(t, b)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("redelivery after the Seek took %v, want 0 (the backoff is abandoned)", waited)
		}
		var attempts []int
		for _, m := range counted.calls() {
			attempts = append(attempts, m.Attempt)
		}
		if want := []int{1, 1}; !slices.Equal(attempts, want) {
			t.Errorf("attempts: got %v, want %v (Seek starts the count again)", attempts, want)
		}
		if got, want := g.Stats(), (pubsub.GroupStats{Delivered: 1, Retried: 1}); got != want {
			t.Errorf("stats: got %+v, want %+v", got, want)
		}
	})
}

// Publish with a key that encodes to nil is still keyed: it is hashed like
// any key (so equal keys share a partition) and delivered with a non-nil,
// empty Key, unlike PublishValue.
func TestKeyThatEncodesToNilIsStillKeyed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsubtest.NewBroker(t)
		topic := mustTopic(t, b, "orders", codec.Bytes(), codec.String(), pubsub.WithPartitions(3))
		var rec recorder[string]
		mustSubscribe(t, topic, "billing", "b1", &rec)
		want := int(crc32.ChecksumIEEE(nil) % 3)
		for i := range 3 {
			if pos := mustPublish(t, topic, nil, fmt.Sprint("keyed-", i)); pos.Partition != want {
				t.Errorf("Publish with a nil key #%d: got partition %d, want %d (hashed, not round robin)", i, pos.Partition, want)
			}
		}
		mustPublishValue(t, topic, "keyless")
		pubsubtest.Drain(t, b)
		for _, m := range rec.calls() {
			keyless := m.Value == "keyless"
			if keyless && m.Key != nil {
				t.Errorf("%s: Key got %#v, want nil", m.Value, m.Key)
			}
			if !keyless && (m.Key == nil || len(m.Key) != 0) {
				t.Errorf("%s: Key got %#v, want non-nil and empty", m.Value, m.Key)
			}
		}
		if n := len(rec.calls()); n != 4 {
			t.Errorf("deliveries: got %d, want 4", n)
		}
	})
}
