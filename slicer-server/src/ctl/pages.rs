//! A job's page on its leader: `GET /jobs/<job>.json` on the instance's pages address
//! (`steady_slicer::fleet::Instance::pages`), over HTTP/1 on a plain TCP connection,
//! bounded in time and in bytes. `steadyctl tasks` reads each task's load there.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{header, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;

/// The largest page accepted, in bytes (8 MiB: a row per task of a job of 65,536 tasks
/// takes about 6 MiB); a larger one is refused and nothing more is read.
pub const MAX_PAGE_BYTES: usize = 8 << 20;

/// What `steadyctl` reads of a job's page (other fields are ignored, so the page may
/// grow): `{"job": "users", "here": "leading", "tasks": [{"task": 0, "state": "serving",
/// "load": 12.5}, ...]}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JobPage {
    /// The job.
    pub job: String,
    /// What the instance does for the job: `leading` (its Assigner leads: the loads are
    /// the ones it assigns with), `campaigning` or `none`.
    pub here: String,
    /// The tasks the instance's Assigner knows.
    #[serde(default)]
    pub tasks: Vec<TaskRow>,
}

/// One task on a job's page.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskRow {
    /// Its index.
    pub task: u32,
    /// `serving`, `draining` or `gone` (anything else is taken as unknown).
    #[serde(default)]
    pub state: Option<String>,
    /// Its load as the Assigner estimates it (`None`: no report yet).
    #[serde(default)]
    pub load: Option<f64>,
}

/// Why a job's page could not be had (one line each).
#[derive(Debug)]
#[non_exhaustive]
pub enum PageError {
    /// The pages address is a URL this client does not speak (`https://`).
    Unsupported(String),
    /// The connection could not be made.
    Connect(std::io::Error),
    /// HTTP failed (the peer closed, sent what is not HTTP/1).
    Http(hyper::Error),
    /// An answer other than 200 OK.
    Status(StatusCode),
    /// A body past [`MAX_PAGE_BYTES`].
    TooLarge,
    /// A body that is not the page's JSON.
    Json(serde_json::Error),
    /// No whole answer within the bound.
    TimedOut(Duration),
}

impl std::fmt::Display for PageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsupported(address) => write!(f, "{address:?}: only plain http:// pages are read"),
            Self::Connect(e) => write!(f, "cannot connect: {e}"),
            Self::Http(e) => write!(f, "HTTP: {e}"),
            Self::Status(status) => write!(f, "answered {status}"),
            Self::TooLarge => write!(f, "a page past {MAX_PAGE_BYTES} bytes, refused"),
            Self::Json(e) => write!(f, "not a job page: {e}"),
            Self::TimedOut(bound) => write!(f, "no answer within {} ms", bound.as_millis()),
        }
    }
}

impl std::error::Error for PageError {}

/// `job`'s page at `pages` (`host:port`, or `http://host:port`), within `timeout` for the
/// whole exchange (connecting included).
///
/// # Errors
///
/// [`PageError`]: the connection, HTTP, a status other than 200, a body past
/// [`MAX_PAGE_BYTES`] or not a page, the time bound.
pub async fn job_page(pages: &str, job: &str, timeout: Duration) -> Result<JobPage, PageError> {
    let authority = authority(pages)?;
    let path = format!("/jobs/{}.json", encoded(job));
    tokio::time::timeout(timeout, get(&authority, &path)).await.map_err(|_| PageError::TimedOut(timeout))?
}

/// The `host:port` of a pages address.
fn authority(pages: &str) -> Result<String, PageError> {
    let bare = match pages.split_once("://") {
        None => pages,
        Some(("http", rest)) => rest,
        Some(_) => return Err(PageError::Unsupported(pages.to_owned())),
    };
    Ok(bare.trim_end_matches('/').to_owned())
}

/// `job` as one path segment: every byte but the unreserved ones (letters, digits,
/// `-._~`) percent-encoded, `/` included.
fn encoded(job: &str) -> String {
    let mut out = String::with_capacity(job.len());
    for byte in job.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

async fn get(authority: &str, path: &str) -> Result<JobPage, PageError> {
    let stream = TcpStream::connect(authority).await.map_err(PageError::Connect)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(PageError::Http)?;
    let driver = tokio::spawn(connection);
    let request = Request::get(path)
        .header(header::HOST, authority)
        .header(header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .expect("a GET of an encoded path is a valid request");
    let result = async {
        let response = sender.send_request(request).await.map_err(PageError::Http)?;
        if response.status() != StatusCode::OK {
            return Err(PageError::Status(response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_PAGE_BYTES).collect().await.map_err(|e| {
            match e.downcast::<hyper::Error>() {
                Ok(e) => PageError::Http(*e),
                // Limited's only other error: the limit.
                Err(_) => PageError::TooLarge,
            }
        })?;
        serde_json::from_slice(&body.to_bytes()).map_err(PageError::Json)
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// Serves one connection: reads the request head, answers `response` (the whole
    /// HTTP text), and hands the head back.
    async fn serve_once(response: Vec<u8>) -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let served = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0; 1024];
            while !head.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its request's end");
                head.extend_from_slice(&buf[..n]);
            }
            let _ = stream.write_all(&response).await;
            let _ = stream.shutdown().await;
            String::from_utf8(head).unwrap()
        });
        (address, served)
    }

    fn ok(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn reads_the_page_of_the_job_it_names_in_the_path() {
        let page = r#"{"job":"a/b c","generation":12,"owner":"slicer-a","here":"leading",
            "tasks":[{"task":0,"state":"serving","slices":3,"key_share":0.25,"load":12.5},
                     {"task":3,"state":"draining","slices":0,"key_share":0,"load":null}]}"#;
        let (address, served) = serve_once(ok(page)).await;
        let got = job_page(&format!("http://{address}/"), "a/b c", Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.here, "leading");
        assert_eq!(
            got.tasks,
            [
                TaskRow { task: 0, state: Some("serving".into()), load: Some(12.5) },
                TaskRow { task: 3, state: Some("draining".into()), load: None },
            ]
        );
        let head = served.await.unwrap();
        assert!(head.starts_with("GET /jobs/a%2Fb%20c.json HTTP/1.1\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains(&format!("host: {address}\r\n")), "{head}");
    }

    #[tokio::test]
    async fn an_answer_other_than_a_page_is_an_error_in_one_line() {
        let (address, _served) =
            serve_once(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec()).await;
        let e = job_page(&address, "users", Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(e.to_string(), "answered 404 Not Found");
        let (address, _served) = serve_once(ok("<html>")).await;
        let e = job_page(&address, "users", Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(e, PageError::Json(_)), "{e}");
        let e = job_page("https://slicer-a:9464", "users", Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(e, PageError::Unsupported(_)), "{e}");
    }

    #[tokio::test]
    async fn a_page_past_the_bound_is_refused() {
        let body = vec![b' '; MAX_PAGE_BYTES + 1];
        let mut answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
        answer.extend_from_slice(&body);
        let (address, _served) = serve_once(answer).await;
        let e = job_page(&address, "users", Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(e, PageError::TooLarge), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_never_answers_is_bounded_in_time() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        // Accepted (by the kernel's backlog) and never answered.
        let e = job_page(&address, "users", Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(e.to_string(), "no answer within 300 ms");
        drop(listener);
    }
}
