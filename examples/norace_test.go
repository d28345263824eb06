//go:build !race

package examples_test

// raceEnabled is true when the tests run with -race: the programs are then
// built with -race too.
const raceEnabled = false
