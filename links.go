package logbus

// The package documentation links to the API with Go doc links such as
// [pubsub.Broker.Close]; they resolve against the imports of the package,
// which holds no code, so it imports what it links to here.
import (
	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
)

var (
	_ pubsub.Broker
	_ codec.Codec[string]
)
