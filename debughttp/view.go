package debughttp

import (
	"time"
)

// The page's data: one model serves the HTML and the JSON, so the two
// never disagree. Field names follow NATS's monitoring endpoints where
// they mean the same (lag ≈ num_pending), in snake_case.
//
// A name (of a topic, group or consumer) is any string, invalid UTF-8
// included, which JSON cannot carry: encoding/json writes each invalid
// byte as U+FFFD, so "orders\xff" and "orders\xfe" would read alike.
// Beside each name that is not printable UTF-8 the JSON has a field ending
// in _escaped holding it as a Go string literal (strconv.Quote; Unquote
// gives the bytes back), distinct for distinct names. The pages show names
// as they show errors: characters that are not printable as escapes.
//
// Every list a response carries is bounded, whatever the broker holds:
// the overview and a topic's view summarise groups without their
// partitions, the topic and group views list partitions a page at a time
// (partitionPage), and consumers, their partitions, stuck deliveries, a
// dead letter's headers and its error are capped (the limits below); a
// count beside each says how many there are in all.
const (
	partitionPage   = 256  // partitions a topic's or a group's view lists at once
	consumerLimit   = 1024 // consumers listed per group
	assignmentLimit = 64   // partitions listed per consumer
	stuckLimit      = 1024 // stuck deliveries listed in the overview
	errorLimit      = 1024 // bytes of a dead letter's error shown
	headerLimit     = 32   // headers shown per dead letter, by name
	headerKeyLimit  = 128  // bytes of a header's name shown
)

// overview is the whole broker: the root page. The topic and group views
// carry its first fields only, for the page's header.
type overview struct {
	Taken    time.Time   `json:"taken"`
	State    string      `json:"state"`
	Partial  bool        `json:"partial,omitempty"` // the engine cannot describe itself: some fields are zero
	Actions  bool        `json:"actions"`           // whether POST actions are enabled
	Payloads bool        `json:"payloads"`          // whether dead letters' bytes and headers are shown
	Topics   []topicView `json:"topics"`
}

// topicView is one topic and its groups; its partitions only in its own
// view, a page at a time.
type topicView struct {
	Name        string `json:"name"`
	NameEscaped string `json:"name_escaped,omitempty"`
	topicCounters
	NumPartitions int             `json:"num_partitions"`
	Partitions    []partitionView `json:"partitions,omitzero"` // the topic's view: this page of them
	Page          *pageView       `json:"page,omitempty"`      // the topic's view: which page
	Groups        []groupView     `json:"groups"`              // summaries
}

// The counters' JSON keys. topicCounters and groupCounters are
// pubsub.TopicStats and pubsub.GroupStats with a key for each field, made
// by conversion (topicCounters(t.Stats)): a counter added to either does
// not compile here until it has its key, and TestEveryCounterIsShown then
// wants it on the page.
type (
	topicCounters struct {
		Published     int64 `json:"published"`
		Retained      int   `json:"retained"`
		RetainedBytes int64 `json:"retained_bytes"`
		Reclaimed     int64 `json:"reclaimed"`
		Dropped       int64 `json:"dropped"`
		Expired       int64 `json:"expired"`
		Blocked       int64 `json:"blocked"`
		TimedOut      int64 `json:"timed_out"`
	}
	groupCounters struct {
		Delivered          int64 `json:"delivered"`
		Retried            int64 `json:"retried"`
		DeadLettered       int64 `json:"dead_lettered"`
		Skipped            int64 `json:"skipped"`
		DeadLettersEvicted int64 `json:"dead_letters_evicted"`
		Redriven           int64 `json:"redriven"` // dead letters sent back to the group
	}
)

// pageView says which partitions a view lists: Shown of them from First.
// Next is where the next page starts (0 on the last page), Prev where the
// previous one does (-1 on the first).
type pageView struct {
	First int `json:"first"`
	Shown int `json:"shown"`
	Next  int `json:"next,omitempty"`
	Prev  int `json:"-"`
	Of    int `json:"-"` // partitions in all
}

type partitionView struct {
	Partition     int   `json:"partition"`
	Earliest      int64 `json:"earliest"`
	End           int64 `json:"end"`
	Retained      int   `json:"retained"`
	RetainedBytes int64 `json:"retained_bytes"`
}

// groupView is one consumer group of a topic: a summary in the overview
// and a topic's view, with its partitions (a page) in its own view.
type groupView struct {
	Name         string         `json:"name"`
	NameEscaped  string         `json:"name_escaped,omitempty"`
	Topic        string         `json:"topic"`
	TopicEscaped string         `json:"topic_escaped,omitempty"`
	Status       string         `json:"status"` // see status
	Paused       bool           `json:"paused"`
	NumConsumers int            `json:"num_consumers"`
	Consumers    []consumerView `json:"consumers"` // in join order, at most consumerLimit
	Lag          int64          `json:"lag"`
	LagSeconds   float64        `json:"lag_seconds"` // age of the oldest record not yet committed
	InFlight     int            `json:"in_flight"`   // partitions with a delivery running
	Stuck        int            `json:"stuck"`       // of them, running past the stuck threshold

	groupCounters
	NumDeadLetters int `json:"num_dead_letters"` // held now

	NumPartitions int                  `json:"num_partitions"`
	Partitions    []groupPartitionView `json:"partitions,omitzero"` // the group's view: this page of them
	Page          *pageView            `json:"page,omitempty"`      // the group's view: which page
	// DeadLetters are the newest first, at most the page's limit: in the
	// overview and the group's view (not in a topic's).
	DeadLetters []letterView `json:"dead_letters,omitzero"`
	// DeadLettersError says why DeadLetters may be short: they could not
	// all be read.
	DeadLettersError string `json:"dead_letters_error,omitempty"`
}

// consumerView is one consumer of a group and the partitions it owns, the
// first assignmentLimit of them.
type consumerView struct {
	Name          string `json:"name"`
	NameEscaped   string `json:"name_escaped,omitempty"`
	NumPartitions int    `json:"num_partitions"`
	Partitions    []int  `json:"partitions"`
}

// groupPartitionView is a group's state on one partition.
type groupPartitionView struct {
	Partition      int     `json:"partition"`
	Owner          string  `json:"owner"`
	OwnerEscaped   string  `json:"owner_escaped,omitempty"`
	Committed      int64   `json:"committed"`
	End            int64   `json:"end"`
	Lag            int64   `json:"lag"`
	LagSeconds     float64 `json:"lag_seconds"`
	InFlight       bool    `json:"in_flight"`
	Retrying       bool    `json:"retrying"`
	Attempt        int     `json:"attempt"`
	RunningSeconds float64 `json:"running_seconds"`
	Stuck          bool    `json:"stuck"`
	Redriving      int     `json:"redriving"`
}

// letterView is one dead letter: its bytes' sizes, and with [WithPayloads]
// their previews.
type letterView struct {
	ID             string    `json:"id"`
	Partition      int       `json:"partition"`
	Offset         int64     `json:"offset"`
	Attempts       int       `json:"attempts"`
	Error          string    `json:"error"`                     // its first errorLimit bytes
	ErrorSize      int       `json:"error_size"`                // bytes in full
	ErrorTruncated bool      `json:"error_truncated,omitempty"` // Error shows only the first bytes
	FailedAt       time.Time `json:"failed_at"`
	Created        time.Time `json:"created"`
	Key            preview   `json:"key"`
	Value          preview   `json:"value"`
	NumHeaders     int       `json:"num_headers"`
	HeaderBytes    int       `json:"header_bytes"` // their names' and values' bytes
	// Headers, with [WithPayloads] only: the first headerLimit by name, each
	// name cut to headerKeyLimit bytes and each value to previewLimit.
	Headers          map[string]string `json:"headers,omitempty"`
	HeadersTruncated bool              `json:"headers_truncated,omitempty"` // Headers shows only some
}

// stuckView is one delivery running past the stuck threshold, for the
// overview's list.
type stuckView struct {
	Topic, Group string
	groupPartitionView
}

// The statuses of a group, worst first: the one shown is the first that
// holds.
const (
	statusPaused   = "paused"   // paused by an operator
	statusStuck    = "stuck"    // a handler runs past the stuck threshold
	statusUnowned  = "unowned"  // lag on a partition no consumer owns
	statusRetrying = "retrying" // a failed record waits out its backoff
	statusLagging  = "lagging"  // records wait to be committed
	statusOK       = "ok"
)
