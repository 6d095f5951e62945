//go:build !linux

package main

import "time"

// preciseSleep sleeps for d on the runtime's timers: elsewhere than on
// Linux, the proxy's delays may come out up to a millisecond longer.
func preciseSleep(d time.Duration) { time.Sleep(d) }
