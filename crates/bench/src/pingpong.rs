//! The TCP reference: a plain blocking ping-pong on loopback between this thread and an echo thread.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;

/// How long either end waits for the other before giving up.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to an echo thread that answers every `request` bytes with `response` bytes, `TCP_NODELAY` on both
/// ends. Dropping it closes the connection and waits for the echo thread.
pub(crate) struct PingPong {
    client: TcpStream,
    out: Vec<u8>,
    back: Vec<u8>,
    echo: Option<JoinHandle<std::io::Result<()>>>,
}

impl PingPong {
    /// Starts the echo thread and connects to it.
    pub(crate) fn start(request: usize, response: usize) -> anyhow::Result<PingPong> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .context("binding the ping-pong listener")?;
        let addr = listener.local_addr()?;
        // Connect before the echo thread accepts (the backlog holds the connection), so that a failure leaves no
        // thread waiting in accept.
        let client = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .context("connecting to the ping-pong echo")?;
        client.set_nodelay(true)?;
        client.set_read_timeout(Some(IO_TIMEOUT))?;
        client.set_write_timeout(Some(IO_TIMEOUT))?;
        let echo = std::thread::Builder::new()
            .name("bench-pingpong".into())
            .spawn(move || echo(listener, request, response))
            .context("spawning the ping-pong echo thread")?;
        Ok(PingPong {
            client,
            out: vec![0x5a; request],
            back: vec![0; response],
            echo: Some(echo),
        })
    }

    /// One exchange: sends the request, waits for the whole response.
    #[inline(always)]
    pub(crate) fn exchange(&mut self) -> std::io::Result<()> {
        self.client.write_all(&self.out)?;
        self.client.read_exact(&mut self.back)
    }

    /// Closes the connection and reports the echo thread's outcome.
    pub(crate) fn finish(mut self) -> anyhow::Result<()> {
        self.stop().context("ping-pong echo")
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        let _ = self.client.shutdown(Shutdown::Both);
        match self.echo.take() {
            None => Ok(()),
            Some(h) => Ok(h
                .join()
                .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??),
        }
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Serves one connection: reads `request` bytes, answers `response` bytes, until the client closes.
fn echo(listener: TcpListener, request: usize, response: usize) -> std::io::Result<()> {
    let (mut stream, _) = listener.accept()?;
    drop(listener);
    stream.set_nodelay(true)?;
    // Long enough for any pause of the client between slices and cases; short enough not to hang forever.
    stream.set_read_timeout(Some(IO_TIMEOUT * 12))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut incoming = vec![0u8; request];
    let reply = vec![0xa5u8; response];
    loop {
        match stream.read_exact(&mut incoming) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
                ) =>
            {
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        stream.write_all(&reply)?;
    }
}
