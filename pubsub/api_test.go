package pubsub_test

// The public surface that users, examples and other code rely on, pinned at
// compile time: a rename or a changed signature breaks the build here first.

import (
	"context"
	"log/slog"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

var (
	_ func(...pubsub.BrokerOption) *pubsub.Broker                                                                                    = pubsub.NewBroker
	_ func(pubsub.Clock) pubsub.BrokerOption                                                                                         = pubsub.WithClock
	_ func(pubsub.RetryPolicy) pubsub.BrokerOption                                                                                   = pubsub.WithRetry
	_ func(*pubsub.Broker, context.Context) error                                                                                    = (*pubsub.Broker).Drain
	_ func(*pubsub.Broker, context.Context) error                                                                                    = (*pubsub.Broker).Close
	_ func(*pubsub.Broker) pubsub.State                                                                                              = (*pubsub.Broker).State
	_ func(*pubsub.Broker, string, string) (int64, error)                                                                            = (*pubsub.Broker).Lag
	_ func(*pubsub.Broker, context.Context, string, string, pubsub.Start) error                                                      = (*pubsub.Broker).Replay
	_                                                                                                                                = []pubsub.State{pubsub.Running, pubsub.Draining, pubsub.Stopped}
	_ func(*pubsub.Broker, string, codec.Codec[string], codec.Codec[int], ...pubsub.TopicOption) (*pubsub.Topic[string, int], error) = pubsub.NewTopic[string, int]
	_ func(int) pubsub.TopicOption                                                                                                   = pubsub.WithPartitions
	_ func(pubsub.Retention) pubsub.TopicOption                                                                                      = pubsub.WithRetention
	_ func(pubsub.Partitioner) pubsub.TopicOption                                                                                    = pubsub.WithPartitioner
	_                                                                                                                                = pubsub.Retention{MaxMessages: 1, MaxAge: time.Second, OnFull: pubsub.DropOldest, BlockTimeout: time.Second, MaxBytes: 1}
	_                                                                                                                                = []pubsub.FullPolicy{pubsub.Block, pubsub.DropOldest}
	_ func() pubsub.Partitioner                                                                                                      = pubsub.KeyHash
	_ func() pubsub.Partitioner                                                                                                      = pubsub.RoundRobin
	_ func(int) pubsub.Partitioner                                                                                                   = pubsub.Sticky
	_ func(*pubsub.Topic[string, int]) string                                                                                        = (*pubsub.Topic[string, int]).Name
	_ func(*pubsub.Topic[string, int]) int                                                                                           = (*pubsub.Topic[string, int]).Partitions
	_ func(*pubsub.Topic[string, int], context.Context, string, int, ...pubsub.PublishOption) (pubsub.Position, error)               = (*pubsub.Topic[string, int]).Publish
	_ func(*pubsub.Topic[string, int], context.Context, int, ...pubsub.PublishOption) (pubsub.Position, error)                       = (*pubsub.Topic[string, int]).PublishValue
	_ func(map[string]string) pubsub.PublishOption                                                                                   = pubsub.WithHeaders
	_                                                                                                                                = pubsub.Position{Partition: 1, Offset: 2}
	_ pubsub.Handler[int]                                                                                                            = pubsub.HandlerFunc[int](nil)
	_                                                                                                                                = pubsub.Message[int]{ID: "", Topic: "", Partition: 0, Offset: 0, Key: nil, Value: 0, Headers: nil, Created: time.Time{}, Attempt: 1}
	_ func(*pubsub.Topic[string, int], string, string, pubsub.Handler[int], ...pubsub.SubscribeOption) (*pubsub.Group[int], error)   = (*pubsub.Topic[string, int]).Subscribe
	_ func(*pubsub.Group[int]) string                                                                                                = (*pubsub.Group[int]).Name
	_ func(*pubsub.Group[int], context.Context, string) error                                                                        = (*pubsub.Group[int]).Leave
	_ func(*pubsub.Group[int]) map[string][]int                                                                                      = (*pubsub.Group[int]).Assignment
	_ func(*pubsub.Group[int], context.Context) error                                                                                = (*pubsub.Group[int]).Pause
	_ func(*pubsub.Group[int], context.Context) error                                                                                = (*pubsub.Group[int]).Resume
	_ func(*pubsub.Group[int], context.Context, int, int64) error                                                                    = (*pubsub.Group[int]).Seek
	_ func(*pubsub.Group[int], context.Context, pubsub.Start) error                                                                  = (*pubsub.Group[int]).Replay
	_ func(*pubsub.Group[int], int) int64                                                                                            = (*pubsub.Group[int]).Committed
	_ func(*pubsub.Group[int]) int64                                                                                                 = (*pubsub.Group[int]).Lag
	_ func(*pubsub.Group[int]) pubsub.GroupStats                                                                                     = (*pubsub.Group[int]).Stats
	_ func(*pubsub.Group[int]) []pubsub.DeadLetter[int]                                                                              = (*pubsub.Group[int]).DeadLetters
	_                                                                                                                                = pubsub.GroupStats{Delivered: 1, Retried: 1, DeadLettered: 1, Skipped: 1}
	_                                                                                                                                = pubsub.DeadLetter[int]{Message: pubsub.Message[int]{}, Attempts: 1, Err: nil, FailedAt: time.Time{}}
	_ func(*pubsub.Topic[string, int], string, string, ...pubsub.SubscribeOption) (*pubsub.Stream[int], error)                       = (*pubsub.Topic[string, int]).Stream
	_ func(*pubsub.Stream[int]) <-chan *pubsub.Delivery[int]                                                                         = (*pubsub.Stream[int]).C
	_ func(*pubsub.Stream[int]) *pubsub.Group[int]                                                                                   = (*pubsub.Stream[int]).Group
	_ func(*pubsub.Stream[int]) error                                                                                                = (*pubsub.Stream[int]).Close
	_ func(*pubsub.Delivery[int])                                                                                                    = (*pubsub.Delivery[int]).Ack
	_ func(*pubsub.Delivery[int], error)                                                                                             = (*pubsub.Delivery[int]).Nack
	_                                                                                                                                = []error{pubsub.ErrTopicExists, pubsub.ErrTopicNotFound, pubsub.ErrClosed, pubsub.ErrBackpressure, pubsub.ErrOffsetOutOfRange, pubsub.ErrSubscription, pubsub.ErrInvalid, pubsub.ErrStalled, pubsub.ErrPermanent}
	_ func() pubsub.Start                                                                                                            = pubsub.Earliest
	_ func() pubsub.Start                                                                                                            = pubsub.Latest
	_ func(int64) pubsub.Start                                                                                                       = pubsub.AtOffset
	_ func(time.Time) pubsub.Start                                                                                                   = pubsub.AtTime
	_ func(pubsub.Start) pubsub.SubscribeOption                                                                                      = pubsub.StartAt
	_                                                                                                                                = pubsub.TopicStats{Published: 1, Retained: 1, RetainedBytes: 1, Reclaimed: 1, Dropped: 1, Expired: 1, Blocked: 1, TimedOut: 1}
	_                                                                                                                                = pubsub.ShutdownError{Unfinished: []pubsub.Unfinished{{Group: "", Topic: "", Partition: 0, Committed: 0, End: 0, Running: true}}, Err: nil}
	_                                                                                                                                = pubsub.PanicError{Value: nil, Stack: nil}
	_ error                                                                                                                          = (*pubsub.ShutdownError)(nil)
	_ error                                                                                                                          = (*pubsub.PanicError)(nil)
	_ func(*pubsub.Topic[string, int], pubsub.Message[int]) (string, error)                                                          = (*pubsub.Topic[string, int]).Key
	_ func(pubsub.Engine) pubsub.BrokerOption                                                                                        = pubsub.WithEngine
	_ func() pubsub.Engine                                                                                                           = pubsub.InMemory
	_ func() codec.Codec[[]byte]                                                                                                     = codec.Bytes
	_ func() codec.Codec[string]                                                                                                     = codec.String
	_ func() codec.Codec[int]                                                                                                        = codec.JSON[int]
	_ func() codec.Codec[int]                                                                                                        = codec.Gob[int]
	_ func() codec.Codec[int8]                                                                                                       = codec.Int[int8]
	_ func(func(int) ([]byte, error), func([]byte) (int, error)) codec.Codec[int]                                                    = codec.Func[int]
)

// The observability surface, which debughttp and the OpenTelemetry module
// build on.
var (
	_ func(*pubsub.Broker) pubsub.Snapshot                                                      = (*pubsub.Broker).Snapshot
	_ func(...pubsub.Hook) pubsub.BrokerOption                                                  = pubsub.WithHooks
	_ func(*slog.Logger) pubsub.BrokerOption                                                    = pubsub.WithLogger
	_ func(time.Duration) pubsub.BrokerOption                                                   = pubsub.WithStuckAfter
	_ func(*pubsub.Group[int], context.Context, func(pubsub.DeadLetter[int]) bool) (int, error) = (*pubsub.Group[int]).Redrive
	_                                                                                           = pubsub.Snapshot{Taken: time.Time{}, State: pubsub.Running, Partial: false, Topics: []pubsub.TopicSnapshot{{Name: "", Stats: pubsub.TopicStats{}, Partitions: []pubsub.PartitionSnapshot{{Partition: 0, Earliest: 0, End: 0, Retained: 0, RetainedBytes: 0, Reclaimed: 0, Dropped: 0, Expired: 0, Blocked: 0, TimedOut: 0}}, Groups: []pubsub.GroupSnapshot{{Name: "", Paused: false, Consumers: nil, Assignment: nil, Stats: pubsub.GroupStats{Redriven: 1}, DeadLetters: 0, Lag: 0, LagAge: 0, Partitions: []pubsub.GroupPartitionSnapshot{{Partition: 0, Owner: "", Committed: 0, Lag: 0, Oldest: time.Time{}, LagAge: 0, InFlight: false, Retrying: false, Attempt: 0, RunningFor: 0, Stuck: false, Redriving: 0}}}}}}}
	_ pubsub.HookPublish                                                                        = hookSet{}
	_ pubsub.HookPublished                                                                      = hookSet{}
	_ pubsub.HookDeliver                                                                        = hookSet{}
	_ pubsub.HookDelivered                                                                      = hookSet{}
	_ pubsub.HookRetry                                                                          = hookSet{}
	_ pubsub.HookDeadLetter                                                                     = hookSet{}
	_ pubsub.HookRebalance                                                                      = hookSet{}
	_ pubsub.HookBackpressure                                                                   = hookSet{}
	_ pubsub.HookDrop                                                                           = hookSet{}
	_ pubsub.HookExpire                                                                         = hookSet{}
	_ pubsub.HookSkip                                                                           = hookSet{}
	_ pubsub.HookStuck                                                                          = hookSet{}
	_ pubsub.HookMembership                                                                     = hookSet{}
	_ pubsub.HookClose                                                                          = hookSet{}
	_                                                                                           = []pubsub.Outcome{pubsub.OutcomeAcked, pubsub.OutcomeFailed, pubsub.OutcomeUndecodable, pubsub.OutcomeGivenBack}
)

// hookSet implements every hook with the signatures the API promises.
type hookSet struct{}

func (hookSet) OnPublish(ctx context.Context, _ *pubsub.PublishInfo) context.Context     { return ctx }
func (hookSet) OnPublished(context.Context, *pubsub.PublishInfo, pubsub.Position, error) {}
func (hookSet) OnDeliver(ctx context.Context, _ *pubsub.DeliveryInfo) context.Context    { return ctx }
func (hookSet) OnDelivered(context.Context, *pubsub.DeliveryInfo, pubsub.DeliveryResult) {}
func (hookSet) OnRetry(pubsub.RetryEvent)                                                {}
func (hookSet) OnDeadLetter(pubsub.DeadLetterEvent)                                      {}
func (hookSet) OnRebalance(pubsub.RebalanceEvent)                                        {}
func (hookSet) OnBackpressure(pubsub.BackpressureEvent)                                  {}
func (hookSet) OnDrop(pubsub.TrimEvent)                                                  {}
func (hookSet) OnExpire(pubsub.TrimEvent)                                                {}
func (hookSet) OnSkip(pubsub.SkipEvent)                                                  {}
func (hookSet) OnStuck(pubsub.StuckEvent)                                                {}
func (hookSet) OnMembership(pubsub.MembershipEvent)                                      {}
func (hookSet) OnClose(pubsub.CloseEvent)                                                {}
