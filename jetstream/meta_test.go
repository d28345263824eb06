package jetstream

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/nats-io/nats.go"
)

// metaCases are keys and headers whose bytes must come back exactly.
var metaCases = []struct {
	name    string
	key     []byte
	headers map[string]string
}{
	{"keyless, no headers", nil, nil},
	{"empty key", []byte{}, nil},
	{"binary key", []byte{0, 0xff, '\r', '\n', 0xc3}, nil},
	// JSON turned both keys into U+FFFD: they merged into one.
	{"invalid UTF-8 header keys", nil, map[string]string{"\xff": "a", "\xfe": "b"}},
	{"invalid UTF-8 values, newlines, empties", []byte("k"),
		map[string]string{"": "", "a": "\xff\xfe\xfd", "b": "line\r\nbreak", "c": " padded "}},
	{"a long key", bytes.Repeat([]byte{0xab}, 30<<10), map[string]string{"h": strings.Repeat("v", 300)}},
}

// TestMetaRoundTrip: encodeMeta and decodeMeta keep every byte, tell a
// keyless record from an empty key, and encode alike whatever the map's
// order.
func TestMetaRoundTrip(t *testing.T) {
	for _, tc := range metaCases {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeMeta(tc.key, tc.headers)
			if tc.key == nil && len(tc.headers) == 0 {
				if b != nil {
					t.Fatalf("encodeMeta of nothing = %q, want nil (no header)", b)
				}
				return
			}
			key, headers, err := decodeMeta(b)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(key, tc.key) || (key == nil) != (tc.key == nil) {
				t.Errorf("key %q (nil %v), want %q (nil %v)", key, key == nil, tc.key, tc.key == nil)
			}
			if !maps.Equal(headers, tc.headers) {
				t.Errorf("headers %q, want %q", headers, tc.headers)
			}
			if again := encodeMeta(tc.key, maps.Clone(tc.headers)); !bytes.Equal(again, b) {
				t.Errorf("a second encoding differs: %x, then %x", b, again)
			}
		})
	}
}

// FuzzDecodeMeta: whatever the bytes, decodeMeta returns an error or a
// key and headers that come back alike through encodeMeta; it never
// panics.
func FuzzDecodeMeta(f *testing.F) {
	for _, tc := range metaCases {
		f.Add(encodeMeta(tc.key, tc.headers))
	}
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		key, headers, err := decodeMeta(b)
		if err != nil {
			return
		}
		if key == nil && len(headers) == 0 {
			return // nothing to carry: encodeMeta sends no header at all
		}
		key2, headers2, err := decodeMeta(encodeMeta(key, headers))
		if err != nil || !bytes.Equal(key2, key) || (key2 == nil) != (key == nil) || !maps.Equal(headers2, headers) {
			t.Errorf("decoded %q %q from %x; through encodeMeta: %q %q, %v", key, headers, b, key2, headers2, err)
		}
	})
}

// TestOldRecordFormIsRead: a record stored by an earlier version (key in
// Lb-Key as base64, headers in Lb-Headers as JSON) is still read.
func TestOldRecordFormIsRead(t *testing.T) {
	h := nats.Header{}
	h.Set(hdrKey, base64.StdEncoding.EncodeToString([]byte("order-1")))
	h.Set(hdrHeaders, `{"trace":"abc"}`)
	rec, err := decodeRecord(h, []byte("v"), 5, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if string(rec.Key) != "order-1" || rec.Headers["trace"] != "abc" || rec.Offset != 4 || string(rec.Value) != "v" {
		t.Errorf("read %+v, want key order-1, header trace=abc, offset 4, value v", rec)
	}
}

// TestKeysAndHeadersRoundTripExactly publishes records whose keys and
// headers hold invalid UTF-8, line breaks and empty strings, with
// Publish and PublishBatch, through a subscriber and back out of the
// dead letters: every byte comes back, as the in-memory engine keeps
// them (JSON made two header keys one).
func TestKeysAndHeadersRoundTripExactly(t *testing.T) {
	b := newBroker(t)
	topic, err := pubsub.NewTopic(b, "bytes", codec.RawBytes(), codec.String(), pubsub.WithPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string]pubsub.Message[string]{}
	g, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
		mu.Lock()
		got[m.Value] = m
		mu.Unlock()
		if strings.HasPrefix(m.Value, "letter") {
			return pubsub.ErrPermanent
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var batch []pubsub.Entry[[]byte, string]
	for _, tc := range metaCases[1:] { // a keyless record is PublishValue's
		if _, err := topic.Publish(ctx, tc.key, "one "+tc.name, pubsub.WithHeaders(tc.headers)); err != nil {
			t.Fatal(err)
		}
		batch = append(batch, pubsub.Entry[[]byte, string]{Key: tc.key, Value: "batch " + tc.name, Headers: tc.headers})
	}
	if _, err := topic.PublishValue(ctx, "one keyless", pubsub.WithHeaders(metaCases[3].headers)); err != nil {
		t.Fatal(err)
	}
	if _, err := topic.PublishBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := topic.Publish(ctx, metaCases[4].key, "letter", pubsub.WithHeaders(metaCases[4].headers)); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	check := func(what string, m pubsub.Message[string], key []byte, headers map[string]string) {
		t.Helper()
		if !bytes.Equal(m.Key, key) || (m.Key == nil) != (key == nil) {
			t.Errorf("%s: key %q (nil %v), want %q (nil %v)", what, m.Key, m.Key == nil, key, key == nil)
		}
		if !maps.Equal(m.Headers, headers) {
			t.Errorf("%s: headers %q, want %q", what, m.Headers, headers)
		}
	}
	for _, tc := range metaCases[1:] {
		key := tc.key
		if key == nil { // Publish encodes a nil []byte as an empty key
			key = []byte{}
		}
		check("one "+tc.name, got["one "+tc.name], key, tc.headers)
		check("batch "+tc.name, got["batch "+tc.name], key, tc.headers)
	}
	check("one keyless", got["one keyless"], nil, metaCases[3].headers)
	dl := g.DeadLetters()
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	check("the dead letter", dl[0].Message, metaCases[4].key, metaCases[4].headers)
}

// TestOversizeKeysAndRecordsAreRefused: a key and headers over
// MaxKeyAndHeadersSize, or a record over the server's max_payload, is
// refused at publish with ErrInvalid, naming the limit, and nothing is
// stored; a key just under the bound is stored and read back.
func TestOversizeKeysAndRecordsAreRefused(t *testing.T) {
	b := newBroker(t)
	topic, err := pubsub.NewTopic(b, "big", codec.RawBytes(), codec.RawBytes())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = topic.Publish(ctx, make([]byte, MaxKeyAndHeadersSize), []byte("v"))
	if !errors.Is(err, pubsub.ErrInvalid) || !strings.Contains(err.Error(), "MaxKeyAndHeadersSize") {
		t.Errorf("a key of MaxKeyAndHeadersSize: %v, want ErrInvalid naming the limit", err)
	}
	_, err = topic.Publish(ctx, []byte("k"), []byte("v"), pubsub.WithHeaders(map[string]string{"h": strings.Repeat("x", MaxKeyAndHeadersSize)}))
	if !errors.Is(err, pubsub.ErrInvalid) {
		t.Errorf("headers of MaxKeyAndHeadersSize: %v, want ErrInvalid", err)
	}
	_, err = topic.Publish(ctx, []byte("k"), make([]byte, 1<<20))
	if !errors.Is(err, pubsub.ErrInvalid) || !strings.Contains(err.Error(), "max_payload") {
		t.Errorf("a value of 1 MiB: %v, want ErrInvalid naming max_payload", err)
	}
	if _, end, _ := topic.Offsets(0); end != 0 {
		t.Errorf("the partition's end is %d after refused publishes, want 0", end)
	}
	key := bytes.Repeat([]byte{0xff}, MaxKeyAndHeadersSize-8)
	if _, err := topic.Publish(ctx, key, []byte("v")); err != nil {
		t.Fatalf("a key %d bytes under the bound: %v", 8, err)
	}
	seen := make(chan []byte, 1)
	if _, err := topic.Subscribe("g", "c1", pubsub.HandlerFunc[[]byte](func(_ context.Context, m pubsub.Message[[]byte]) error {
		seen <- m.Key
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-seen:
		if !bytes.Equal(k, key) {
			t.Errorf("the long key came back as %d bytes, not the %d published", len(k), len(key))
		}
	case <-ctx.Done():
		t.Fatal("the record with the long key was not delivered")
	}
}
