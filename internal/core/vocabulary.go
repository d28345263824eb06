package core

import "github.com/logbus/logbus/engine"

// The in-memory engine speaks the boundary's vocabulary: the records,
// configurations, counters and errors it takes and returns are the
// boundary's own types (package engine), named here as the rest of this
// package uses them, so that values cross the boundary as they are.
type (
	Record         = engine.Record
	Delivery       = engine.Delivery
	Handler        = engine.Handler
	Batch          = engine.Batch
	BatchHandler   = engine.BatchHandler
	BatchSpec      = engine.BatchSpec
	BatchError     = engine.BatchError
	Config         = engine.Config
	Clock          = engine.Clock
	IDSource       = engine.IDSource
	TopicSpec      = engine.TopicSpec
	Retention      = engine.Retention
	FullPolicy     = engine.FullPolicy
	RetryPolicy    = engine.RetryPolicy
	GroupSpec      = engine.GroupSpec
	Start          = engine.Start
	State          = engine.State
	PartitionStats = engine.PartitionStats
	GroupStats     = engine.GroupStats
	DeadLetter     = engine.DeadLetter
	Unfinished     = engine.Unfinished
	ShutdownError  = engine.ShutdownError
	PanicError     = engine.PanicError
)

const (
	Block         = engine.Block
	DropOldest    = engine.DropOldest
	StartEarliest = engine.StartEarliest
	StartLatest   = engine.StartLatest
	StartOffset   = engine.StartOffset
	StartTime     = engine.StartTime
	Running       = engine.Running
	Draining      = engine.Draining
	Stopped       = engine.Stopped

	DefaultDeadLetterLimit = engine.DefaultDeadLetterLimit
	MaxPartitions          = engine.MaxPartitions
	MaxTopicMessages       = engine.MaxTopicMessages
)

var (
	ErrTopicExists      = engine.ErrTopicExists
	ErrTopicNotFound    = engine.ErrTopicNotFound
	ErrClosed           = engine.ErrClosed
	ErrBackpressure     = engine.ErrBackpressure
	ErrOffsetOutOfRange = engine.ErrOffsetOutOfRange
	ErrSubscription     = engine.ErrSubscription
	ErrInvalid          = engine.ErrInvalid
	ErrStalled          = engine.ErrStalled
	ErrPermanent        = engine.ErrPermanent
	ErrAbandoned        = engine.ErrAbandoned
	ErrNotDelivered     = engine.ErrNotDelivered
)
