package jetstream

// What the engine persists on the server, and in which form. Every form is
// the engine's own: what a structured value is stored as is a type of this
// file (or assign.go's deal), its JSON names fixed by tags and versioned,
// never the JSON of a type of the engine boundary (package engine), whose
// fields may be renamed freely; what another broker finds there must mean
// the same to it, whichever version of logbus wrote it.
//
//	what                         where                               form
//	a group's options            its consumers' metadata (metaSpec)  storedSpec: JSON, "v" 1
//	a group's assignment         the deal bucket, <t>.<g>.deal       deal (assign.go): JSON, "v" 1
//	its discarded dead letters   the deal bucket, <t>.<g>.discarded  text: "<stream created>:<count>" (dlq.go)
//	a member                     the membership bucket, its key      text: the broker's instance ID
//	a group's name               its consumers' metadata             text (logbus_group)
//	a topic's name, partitions   its streams' metadata               text (logbus_topic, logbus_partitions)
//	a record's key and headers   its message's header Lb-Meta        binary, version 1 (meta.go)
//	a dead letter's details      its message's headers Lb-*          text (dlq.go)
//
// Earlier versions stored a group's options as the JSON of the boundary's
// GroupSpec, untagged, under metaLegacySpec: a group made then is read in
// that form (legacySpec), once, when a broker opens it; this version
// writes only storedSpec. A broker of an earlier version refuses a group
// this version made (it finds no options it can read: ErrSubscription), so
// the brokers of a group are upgraded before they make new groups. A
// stored deal before its version had no "v", and is read as version 1;
// one of a later version is an error of the reconcile, never overwritten.

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/logbus/logbus/engine"
)

// The keys of a group's options in its consumers' metadata.
const (
	metaSpec       = "logbus_group_spec" // storedSpec
	metaLegacySpec = "logbus_spec"       // legacySpec: read, never written
)

// specVersion is the version of storedSpec this engine writes, and the
// latest it reads.
const specVersion = 1

// storedSpec is a group's options as its consumers carry them, resolved
// ([engine.GroupSpec.Resolve]), so that a broker joining an existing group
// can tell whether its options match.
type storedSpec struct {
	Version         int         `json:"v"`
	Retry           storedRetry `json:"retry"`
	DeadLetterLimit int         `json:"dead_letter_limit"` // engine.NoDeadLetters is -1
	Start           storedStart `json:"start"`
	KeyConcurrency  int         `json:"key_concurrency,omitempty"` // 0 and 1 are the same (engine.GroupSpec.Equal)
}

// storedRetry is a group's [engine.RetryPolicy]; durations in nanoseconds.
type storedRetry struct {
	MaxAttempts int     `json:"max_attempts"`
	BaseDelay   int64   `json:"base_delay_ns"`
	Multiplier  float64 `json:"multiplier"`
	MaxDelay    int64   `json:"max_delay_ns"`
}

// storedStart is a group's [engine.Start]: its kind by name, so that the
// boundary may number its kinds as it likes.
type storedStart struct {
	Kind   string    `json:"kind"` // one of startKinds
	Offset int64     `json:"offset,omitempty"`
	Time   time.Time `json:"time,omitzero"` // RFC 3339, to the nanosecond
}

// startKinds names each [engine.StartKind] in a storedStart.
var startKinds = map[engine.StartKind]string{
	engine.StartEarliest: "earliest",
	engine.StartLatest:   "latest",
	engine.StartOffset:   "offset",
	engine.StartTime:     "time",
}

// encodeSpec returns the stored form of spec, a resolved spec.
func encodeSpec(spec engine.GroupSpec) string {
	r := spec.Retry
	b, _ := json.Marshal(storedSpec{
		Version: specVersion,
		Retry: storedRetry{MaxAttempts: r.MaxAttempts, BaseDelay: int64(r.BaseDelay), Multiplier: r.Multiplier,
			MaxDelay: int64(r.MaxDelay)},
		DeadLetterLimit: spec.DeadLetterLimit,
		Start:           storedStart{Kind: startKinds[spec.Start.Kind], Offset: spec.Start.Offset, Time: spec.Start.Time},
		KeyConcurrency:  spec.KeyConcurrency,
	})
	return string(b)
}

// decodeSpec reads a group's options from its consumer's metadata: the
// stored form, or, when there is none, the legacy form.
func decodeSpec(md map[string]string) (engine.GroupSpec, error) {
	v, ok := md[metaSpec]
	if !ok {
		legacy, ok := md[metaLegacySpec]
		if !ok {
			return engine.GroupSpec{}, fmt.Errorf("no options in its metadata")
		}
		return decodeLegacySpec(legacy)
	}
	var s storedSpec
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return engine.GroupSpec{}, fmt.Errorf("its options: %w", err)
	}
	if s.Version < 1 || s.Version > specVersion {
		return engine.GroupSpec{}, fmt.Errorf("its options are of version %d, this version of logbus reads 1 to %d", s.Version, specVersion)
	}
	kind, ok := startKindNamed(s.Start.Kind)
	if !ok {
		return engine.GroupSpec{}, fmt.Errorf("its options start at %q, which this version of logbus does not know", s.Start.Kind)
	}
	return engine.GroupSpec{
		Retry: engine.RetryPolicy{MaxAttempts: s.Retry.MaxAttempts, BaseDelay: time.Duration(s.Retry.BaseDelay),
			Multiplier: s.Retry.Multiplier, MaxDelay: time.Duration(s.Retry.MaxDelay)},
		DeadLetterLimit: s.DeadLetterLimit,
		Start:           engine.Start{Kind: kind, Offset: s.Start.Offset, Time: s.Start.Time},
		KeyConcurrency:  s.KeyConcurrency,
	}, nil
}

// startKindNamed is the kind startKinds names name.
func startKindNamed(name string) (engine.StartKind, bool) {
	for k, n := range startKinds {
		if n == name {
			return k, true
		}
	}
	return 0, false
}

// legacySpec is the form in which versions before storedSpec stored a
// group's options: the JSON of [engine.GroupSpec] as it was then, untagged.
// It is frozen here, names and kind numbers, whatever becomes of the
// boundary's types.
type legacySpec struct {
	Retry struct {
		MaxAttempts int           `json:"MaxAttempts"`
		BaseDelay   time.Duration `json:"BaseDelay"`
		Multiplier  float64       `json:"Multiplier"`
		MaxDelay    time.Duration `json:"MaxDelay"`
	} `json:"Retry"`
	DeadLetterLimit int `json:"DeadLetterLimit"`
	Start           struct {
		Kind   int8      `json:"Kind"` // 0 earliest, 1 latest, 2 offset, 3 time
		Offset int64     `json:"Offset"`
		Time   time.Time `json:"Time"`
	} `json:"Start"`
	KeyConcurrency int `json:"KeyConcurrency"` // in the last versions that wrote this form only
}

// legacyStartKinds are legacySpec's kind numbers.
var legacyStartKinds = []engine.StartKind{engine.StartEarliest, engine.StartLatest, engine.StartOffset, engine.StartTime}

// decodeLegacySpec reads a group's options in the legacy form.
func decodeLegacySpec(v string) (engine.GroupSpec, error) {
	var s legacySpec
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return engine.GroupSpec{}, fmt.Errorf("its options (the form of earlier versions): %w", err)
	}
	if s.Start.Kind < 0 || int(s.Start.Kind) >= len(legacyStartKinds) {
		return engine.GroupSpec{}, fmt.Errorf("its options (the form of earlier versions) start at kind %d", s.Start.Kind)
	}
	return engine.GroupSpec{
		Retry: engine.RetryPolicy{MaxAttempts: s.Retry.MaxAttempts, BaseDelay: s.Retry.BaseDelay,
			Multiplier: s.Retry.Multiplier, MaxDelay: s.Retry.MaxDelay},
		DeadLetterLimit: s.DeadLetterLimit,
		Start:           engine.Start{Kind: legacyStartKinds[s.Start.Kind], Offset: s.Start.Offset, Time: s.Start.Time},
		KeyConcurrency:  s.KeyConcurrency,
	}, nil
}
