"""The Pipecat service around the duplex engine: 80 ms clock, levelling, resampling, frames, call artifacts."""
