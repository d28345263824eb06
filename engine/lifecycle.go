package engine

import "context"

// The optional abilities of the lifecycle and health: deleting groups and
// topics, discarding and paging dead letters, answering a ping. The typed
// layer asks for each with a type assertion. Without Deleter or
// [DeadLetterDiscarder] its calls fail with [ErrInvalid], saying the engine
// cannot; without Pinger, Ping is nil (an engine that needs no server is
// always reachable); without [DeadLetterReader], the newest letters are
// taken from [Group.DeadLetters].

// Deleter is implemented by an Engine that can delete groups and topics.
//
// A deletion takes effect before the call waits for anything: ctx bounds
// only the wait for the deliveries in flight (handlers running, Stream
// deliveries held). An error that wraps ctx's error, and no sentinel,
// means exactly that: the deletion took place and the wait was cut short
// (the typed layer then forgets its handles all the same); those
// deliveries finish in the background and commit nothing. An engine that
// could not delete (its server did not answer) returns an error wrapping
// [ErrUnavailable], even when ctx's ended too. Once Close began, both
// methods return [ErrClosed].
type Deleter interface {
	// DeleteGroup stops the group's consumers (each consumer's onLeave
	// runs, as after Leave), forgets its offsets and dead letters, and
	// wakes publishers parked on a partition the group held full, which
	// then append or fail by the usual rules. A group that does not exist
	// is [ErrSubscription]; a topic, [ErrTopicNotFound]. From then on every
	// call on the deleted Group that returns an error fails with
	// ErrSubscription, and its reads (Lag, Committed, Assignment,
	// DeadLetters) show an empty group; the group's name may be used
	// again, as a new group with no offsets or dead letters.
	DeleteGroup(ctx context.Context, topic, group string) error
	// DeleteTopic deletes the topic's groups as DeleteGroup does, and the
	// topic: every call on the deleted Topic and its Groups that returns
	// an error fails with [ErrTopicNotFound] from then on, even after the
	// name is created again, and publishers parked on its partitions fail
	// with it. The name may be created again at once.
	DeleteTopic(ctx context.Context, topic string) error
}

// Pinger is implemented by an Engine that depends on something it may
// fail to reach.
type Pinger interface {
	// Ping returns nil when the engine can serve calls now, and an error
	// wrapping [ErrUnavailable] when it cannot reach what it depends on.
	// After Close it returns nil or [ErrClosed], never ErrUnavailable.
	Ping(ctx context.Context) error
}

// DeadLetterDiscarder is implemented by a Group that can drop dead letters
// without delivering them.
type DeadLetterDiscarder interface {
	// DiscardDeadLetters removes the dead letters match accepts (every one
	// when match is nil) and returns how many it removed; the others keep
	// their order. match runs under no lock of the engine's. ctx bounds the
	// call; when it ends part way, the letters removed so far stay removed
	// and are counted, and the error wraps ctx's. Once Close began it
	// returns [ErrClosed]; on a deleted group, the deletion's error.
	DiscardDeadLetters(ctx context.Context, match func(*DeadLetter) bool) (int, error)
}

// DeadLetterReader is implemented by a Group that can read its newest dead
// letters without copying the others.
type DeadLetterReader interface {
	// LatestDeadLetters returns the group's newest n dead letters (all of
	// them when it holds fewer), newest first; n = 0 returns none, and a
	// negative n is [ErrInvalid]. When it could not read them all (ctx
	// ended, the server did not answer) it returns those it read with an
	// error saying why: a short result is never silent. Like DeadLetters it
	// is a read and works after Close where the engine still holds the
	// letters (one that cannot reach them then returns [ErrClosed]); on a
	// deleted group it returns the deletion's error.
	LatestDeadLetters(ctx context.Context, n int) ([]DeadLetter, error)
}
