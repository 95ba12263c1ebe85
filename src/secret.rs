//! Credentials: a value that is never printed, and the one way to read it from a mounted file or
//! an environment variable.

use std::fmt;
use std::path::Path;

/// A password or key. `Debug` shows whether it is set, never what it is; clap accepts any string
/// for it, so a parse error cannot echo it either.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one client call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A file's content wins over `value` (a mounted Kubernetes Secret is the preferred source);
    /// the trailing newline editors and `kubectl create secret --from-file` leave is dropped.
    /// An empty file is an error (a Secret made from an unset variable: the server would refuse
    /// the login without saying why). Errors name the file, never its content.
    pub fn from_file_or(
        file: Option<&Path>,
        value: Option<&Secret>,
    ) -> std::io::Result<Option<Secret>> {
        match file {
            Some(path) => match std::fs::read_to_string(path) {
                Ok(text) => match text.trim_end_matches(['\n', '\r']) {
                    "" => Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "reading {}: the file is empty (a Secret made from an unset variable?)",
                            path.display()
                        ),
                    )),
                    value => Ok(Some(Secret(value.to_owned()))),
                },
                Err(e) => Err(std::io::Error::new(
                    e.kind(),
                    format!("reading {}: {e}", path.display()),
                )),
            },
            None => Ok(value.cloned()),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "Secret(empty)"
        } else {
            "Secret(redacted)"
        })
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Secret, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_contains_the_value() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(redacted)");
        assert_eq!(format!("{:?}", Secret::default()), "Secret(empty)");
    }

    #[test]
    fn a_file_wins_over_the_variable_and_loses_its_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "from-file\n").unwrap();
        let env = Secret::new("from-env");
        assert_eq!(
            Secret::from_file_or(Some(&file), Some(&env)).unwrap(),
            Some(Secret::new("from-file"))
        );
        assert_eq!(Secret::from_file_or(None, Some(&env)).unwrap(), Some(env));
        let missing = Secret::from_file_or(Some(&dir.path().join("absent")), None).unwrap_err();
        assert!(missing.to_string().contains("absent"), "{missing}");
        std::fs::write(&file, "\n").unwrap();
        let empty = Secret::from_file_or(Some(&file), None).unwrap_err();
        assert!(
            empty.to_string().contains("password: the file is empty"),
            "{empty}"
        );
    }
}
