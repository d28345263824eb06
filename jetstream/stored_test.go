package jetstream

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/logbus/logbus/engine"
)

// specCases are resolved group options that must come back Equal from
// their stored form.
var specCases = []struct {
	name string
	spec engine.GroupSpec
}{
	{"the defaults", engine.GroupSpec{Retry: engine.RetryPolicy{MaxAttempts: 3, BaseDelay: 10 * time.Millisecond, Multiplier: 2, MaxDelay: time.Second},
		DeadLetterLimit: engine.DefaultDeadLetterLimit}},
	{"no dead letters, an odd multiplier", engine.GroupSpec{Retry: engine.RetryPolicy{MaxAttempts: 1, BaseDelay: 1, Multiplier: 1.1, MaxDelay: time.Hour + 1},
		DeadLetterLimit: engine.NoDeadLetters}},
	{"start latest", engine.GroupSpec{Retry: engine.RetryPolicy{MaxAttempts: 2}, DeadLetterLimit: 5, Start: engine.Start{Kind: engine.StartLatest}}},
	{"start at an offset", engine.GroupSpec{DeadLetterLimit: 7, Start: engine.Start{Kind: engine.StartOffset, Offset: 1 << 40}}},
	{"start at a time, to the nanosecond, not in UTC", engine.GroupSpec{DeadLetterLimit: 7,
		Start: engine.Start{Kind: engine.StartTime, Time: time.Date(2026, 12, 4, 10, 11, 12, 13, time.FixedZone("X", 3600))}}},
	{"key concurrency", engine.GroupSpec{DeadLetterLimit: 7, KeyConcurrency: 16}},
}

// TestStoredSpecRoundTrip: a group's options come back Equal from the
// form its consumers carry.
func TestStoredSpecRoundTrip(t *testing.T) {
	for _, tc := range specCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeSpec(map[string]string{metaSpec: encodeSpec(tc.spec)})
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(tc.spec) {
				t.Errorf("got %+v, want %+v", got, tc.spec)
			}
		})
	}
}

// TestStoredSpecForm: the stored form is the engine's own, names fixed by
// its tags, the start's kind by name: renaming a field of
// engine.GroupSpec, or renumbering its start kinds, does not change what
// existing groups are compared against.
func TestStoredSpecForm(t *testing.T) {
	spec := engine.GroupSpec{Retry: engine.RetryPolicy{MaxAttempts: 3, BaseDelay: 10 * time.Millisecond, Multiplier: 2, MaxDelay: time.Second},
		DeadLetterLimit: 1024, Start: engine.Start{Kind: engine.StartOffset, Offset: 7}, KeyConcurrency: 1}
	const want = `{"v":1,"retry":{"max_attempts":3,"base_delay_ns":10000000,"multiplier":2,"max_delay_ns":1000000000},` +
		`"dead_letter_limit":1024,"start":{"kind":"offset","offset":7},"key_concurrency":1}`
	if got := encodeSpec(spec); got != want {
		t.Errorf("stored form\n%s\nwant\n%s", got, want)
	}
}

// legacySpecJSON is a group's options as versions before the stored form
// wrote them (the JSON of engine.GroupSpec as it was), and what they
// mean.
const legacySpecJSON = `{"Retry":{"MaxAttempts":5,"BaseDelay":20000000,"Multiplier":3,"MaxDelay":2000000000},` +
	`"DeadLetterLimit":10,"Start":{"Kind":2,"Offset":4,"Time":"0001-01-01T00:00:00Z"}}`

var legacySpecMeans = engine.GroupSpec{Retry: engine.RetryPolicy{MaxAttempts: 5, BaseDelay: 20 * time.Millisecond, Multiplier: 3, MaxDelay: 2 * time.Second},
	DeadLetterLimit: 10, Start: engine.Start{Kind: engine.StartOffset, Offset: 4}}

// TestLegacySpecIsRead: options in the form of earlier versions are read,
// those of the last ones with their key concurrency, and a consumer that
// carries both forms is read in the stored one.
func TestLegacySpecIsRead(t *testing.T) {
	got, err := decodeSpec(map[string]string{metaLegacySpec: legacySpecJSON})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(legacySpecMeans) {
		t.Errorf("got %+v, want %+v", got, legacySpecMeans)
	}
	const withKeys = `{"Retry":{"MaxAttempts":3,"BaseDelay":10000000,"Multiplier":2,"MaxDelay":1000000000},` +
		`"DeadLetterLimit":1024,"Start":{"Kind":0,"Offset":0,"Time":"0001-01-01T00:00:00Z"},"KeyConcurrency":4}`
	if got, err := decodeSpec(map[string]string{metaLegacySpec: withKeys}); err != nil || got.KeyConcurrency != 4 {
		t.Errorf("the last legacy form, key concurrency 4: got %+v, %v", got, err)
	}
	both, err := decodeSpec(map[string]string{metaLegacySpec: legacySpecJSON, metaSpec: encodeSpec(specCases[0].spec)})
	if err != nil || !both.Equal(specCases[0].spec) {
		t.Errorf("both forms: got %+v, %v; want the stored form's %+v", both, err, specCases[0].spec)
	}
}

// TestStoredSpecRefused: options this version cannot read are an error,
// never a group with other options.
func TestStoredSpecRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   map[string]string
		want string
	}{
		{"none", map[string]string{"logbus_group": "g"}, "no options"},
		{"not JSON", map[string]string{metaSpec: "{"}, "its options"},
		{"a later version", map[string]string{metaSpec: `{"v":2,"start":{"kind":"earliest"}}`}, "version 2"},
		{"no version", map[string]string{metaSpec: `{"start":{"kind":"earliest"}}`}, "version 0"},
		{"an unknown start", map[string]string{metaSpec: `{"v":1,"start":{"kind":"sideways"}}`}, `"sideways"`},
		{"a legacy start out of range", map[string]string{metaLegacySpec: `{"Start":{"Kind":4}}`}, "kind 4"},
		{"legacy, not JSON", map[string]string{metaLegacySpec: "["}, "earlier versions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeSpec(tc.md); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decodeSpec(%q) = %v, want an error saying %q", tc.md, err, tc.want)
			}
		})
	}
}

// openEngine opens an engine with opts on the shared server, closed at
// cleanup.
func openEngine(t *testing.T, opts []Option) *eng {
	t.Helper()
	ee, err := testServer.Engine(opts...).(*opener).Open(engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ee.Close(ctx)
	})
	return ee.(*eng)
}

// TestGroupOfAnEarlierVersion: a group whose consumers carry its options
// in the form earlier versions wrote is attached to and compared as it
// was: Subscribe with other options fails, with the same ones joins it
// and gets its records, and a broker that only names it reads its
// options.
func TestGroupOfAnEarlierVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := testOptions()
	e := openEngine(t, opts)
	tt, err := e.CreateTopic(ctx, "orders", engine.TopicSpec{Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	tp := tt.(*topic)
	// The consumers as an earlier version made them: the configuration
	// is this version's, the options in the earlier form.
	old := &group{e: e, t: tp, name: "billing", spec: legacySpecMeans}
	for p := range tp.parts {
		cfg := old.consumerConfig(p)
		cfg.Metadata = map[string]string{"logbus_group": "billing", metaLegacySpec: legacySpecJSON}
		if _, err := e.js.CreateConsumer(ctx, e.names.stream("orders", p), cfg); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, 1)
	h := func(_ context.Context, d *engine.Delivery) error {
		got <- string(d.Record.Value)
		return nil
	}
	other := legacySpecMeans
	other.DeadLetterLimit++
	if _, err := e.Subscribe(ctx, "orders", "billing", "a", h, nil, other); !errors.Is(err, engine.ErrSubscription) ||
		!strings.Contains(err.Error(), "other options") {
		t.Fatalf("Subscribe with other options: %v, want ErrSubscription: the group exists with other options", err)
	}
	if _, err := e.Subscribe(ctx, "orders", "billing", "a", h, nil, legacySpecMeans); err != nil {
		t.Fatalf("Subscribe with the group's options: %v", err)
	}
	if _, err := tp.AppendOne(ctx, 1, &engine.Record{Value: []byte("order 1")}); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v != "order 1" {
			t.Errorf("delivered %q, want order 1", v)
		}
	case <-ctx.Done():
		t.Fatal("the record published to the group of an earlier version was not delivered")
	}

	other2 := openEngine(t, opts)
	if _, err := other2.CreateTopic(ctx, "orders", engine.TopicSpec{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	g, err := other2.Group(ctx, "orders", "billing")
	if err != nil {
		t.Fatal(err)
	}
	if spec := g.(*group).spec; !spec.Equal(legacySpecMeans) {
		t.Errorf("a broker naming the group reads its options as %+v, want %+v", spec, legacySpecMeans)
	}
}

// TestNewGroupsStoreTheirOwnForm: a group made now carries its options,
// resolved, in the stored form only, which reads back Equal.
func TestNewGroupsStoreTheirOwnForm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := openEngine(t, testOptions())
	if _, err := e.CreateTopic(ctx, "orders", engine.TopicSpec{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	spec := specCases[4].spec
	gg, err := e.Subscribe(ctx, "orders", "billing", "a", func(context.Context, *engine.Delivery) error { return nil }, nil, spec)
	if err != nil {
		t.Fatal(err)
	}
	info, err := gg.(*group).consumers[0].Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if spec, err = spec.Resolve(e.retry); err != nil {
		t.Fatal(err)
	}
	md := info.Config.Metadata
	if _, ok := md[metaLegacySpec]; ok {
		t.Errorf("metadata %q carries the earlier form too", md)
	}
	if got, err := decodeSpec(map[string]string{metaSpec: md[metaSpec]}); err != nil || !got.Equal(spec) {
		t.Errorf("stored options %q read as %+v, %v; want %+v", md[metaSpec], got, err, spec)
	}
}

// TestDealVersions: a deal stored before deals were versioned is read as
// it is; the next deal is stored with its version; a deal of a later
// version is an error, not overwritten.
func TestDealVersions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := openEngine(t, testOptions())
	const key = "t.g.deal"
	if _, err := e.deals.Put(ctx, key, []byte(`{"members":["a"],"owners":["a","a"]}`)); err != nil {
		t.Fatal(err)
	}
	d, err := currentDeal(ctx, e.deals, key, []string{"a"}, 2)
	if err != nil || d.Version != 0 || strings.Join(d.Owners, ",") != "a,a" {
		t.Fatalf("an unversioned deal over the same members: %+v, %v; want it as stored", d, err)
	}
	if d, err = currentDeal(ctx, e.deals, key, []string{"a", "b"}, 2); err != nil || d.Version != dealVersion {
		t.Fatalf("the next deal: %+v, %v; want version %d", d, err, dealVersion)
	}
	entry, err := e.deals.Get(ctx, key)
	if err != nil || !strings.Contains(string(entry.Value()), `"v":1`) {
		t.Fatalf("stored deal %s (%v), want version 1", entry.Value(), err)
	}
	later := []byte(`{"v":2,"members":["a"],"owners":["a","a"]}`)
	if _, err := e.deals.Put(ctx, key, later); err != nil {
		t.Fatal(err)
	}
	if _, err := currentDeal(ctx, e.deals, key, []string{"a", "b"}, 2); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("a deal of a later version: %v, want an error naming version 2", err)
	}
	if entry, err := e.deals.Get(ctx, key); err != nil || string(entry.Value()) != string(later) {
		t.Errorf("the later deal became %s (%v): it was overwritten", entry.Value(), err)
	}
}
