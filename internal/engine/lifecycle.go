package engine

import "context"

// The optional abilities of the lifecycle and health: deleting groups and
// topics, discarding and paging dead letters, answering a ping. The typed
// layer asks for each with a type assertion. Without Deleter or
// DeadLetterDiscarder its calls fail with ErrInvalid, saying the engine
// cannot; without Pinger, Ping is nil (an engine that needs no server is
// always reachable); without DeadLetterReader, the newest letters are
// taken from Group.DeadLetters.

// Deleter is implemented by an Engine that can delete groups and topics.
type Deleter interface {
	// DeleteGroup stops the group's consumers (as Leave does, bounded by
	// ctx), forgets its offsets and dead letters, and wakes publishers
	// parked on a partition the group held full. A group that does not
	// exist is ErrSubscription; a topic, ErrTopicNotFound. The group's
	// name may then be used again, as a new group.
	DeleteGroup(ctx context.Context, topic, group string) error
	// DeleteTopic deletes the topic's groups as DeleteGroup does, then the
	// topic: every call on the deleted Topic and its Groups fails with
	// ErrTopicNotFound from then on, even after the name is created again.
	DeleteTopic(ctx context.Context, topic string) error
}

// Pinger is implemented by an Engine that depends on something it may
// fail to reach.
type Pinger interface {
	// Ping returns nil when the engine can serve calls now, and an error
	// wrapping ErrUnavailable when it cannot reach what it depends on.
	// After Close it returns nil or ErrClosed, never ErrUnavailable.
	Ping(ctx context.Context) error
}

// DeadLetterDiscarder is implemented by a Group that can drop dead letters
// without delivering them.
type DeadLetterDiscarder interface {
	// DiscardDeadLetters removes the dead letters match accepts (every one
	// when match is nil) and returns how many it removed. match runs under
	// no lock of the engine's. ctx bounds the call; when it ends part way,
	// the letters removed so far stay removed and are counted.
	DiscardDeadLetters(ctx context.Context, match func(*DeadLetter) bool) (int, error)
}

// DeadLetterReader is implemented by a Group that can read its newest dead
// letters without copying the others.
type DeadLetterReader interface {
	// LatestDeadLetters returns the group's newest n dead letters, newest
	// first. When it could not read them all (ctx ended, the server did
	// not answer) it returns those it read with an error saying why: a
	// short result is never silent.
	LatestDeadLetters(ctx context.Context, n int) ([]DeadLetter, error)
}
