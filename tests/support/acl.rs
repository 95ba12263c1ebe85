//! ACLs on a broker that enforces them (`SecureBroker::start_enforcing_acls`), created with
//! librdkafka's admin API (CreateAcls), which rust-rdkafka does not wrap.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer};

#[derive(Clone, Copy, Debug)]
pub enum Resource<'a> {
    Topic(&'a str),
    Group(&'a str),
}

#[derive(Clone, Copy, Debug)]
pub enum Operation {
    Read,
    Write,
    DescribeConfigs,
}

/// Allows `principal` (`User:NAME`) each operation on each resource (the literal name), from
/// any host, and waits until the broker enforces them (its authorizer applies ACLs from the
/// metadata log a moment after the controller commits them); `base` must connect as a super
/// user. Panics on any refusal.
pub fn allow(base: &ClientConfig, principal: &str, grants: &[(Resource<'_>, Operation)]) {
    let client: BaseProducer = base.create().expect("admin client");
    let rk = client.client().native_ptr();
    let principal = CString::new(principal).unwrap();
    let host = CString::new("*").unwrap();
    let mut errstr = [0 as c_char; 512];
    // SAFETY: every pointer passed is live for the call (the bindings until destroyed below,
    // CreateAcls copies them).
    unsafe {
        let mut bindings: Vec<*mut rd::rd_kafka_AclBinding_t> = grants
            .iter()
            .map(|&(resource, operation)| {
                let (restype, name) = match resource {
                    Resource::Topic(name) => {
                        (rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC, name)
                    }
                    Resource::Group(name) => {
                        (rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_GROUP, name)
                    }
                };
                let operation = match operation {
                    Operation::Read => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_READ,
                    Operation::Write => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_WRITE,
                    Operation::DescribeConfigs => {
                        rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS
                    }
                };
                let name = CString::new(name).unwrap();
                let binding = rd::rd_kafka_AclBinding_new(
                    restype,
                    name.as_ptr(),
                    rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
                    principal.as_ptr(),
                    host.as_ptr(),
                    operation,
                    rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
                    errstr.as_mut_ptr(),
                    errstr.len(),
                );
                assert!(
                    !binding.is_null(),
                    "ACL binding: {}",
                    CStr::from_ptr(errstr.as_ptr()).to_string_lossy()
                );
                binding
            })
            .collect();
        let created = admin_call(
            rk,
            |queue| {
                rd::rd_kafka_CreateAcls(
                    rk,
                    bindings.as_mut_ptr(),
                    bindings.len(),
                    std::ptr::null(),
                    queue,
                )
            },
            |event| {
                let result = rd::rd_kafka_event_CreateAcls_result(event);
                let mut count = 0;
                let results = rd::rd_kafka_CreateAcls_result_acls(result, &mut count);
                (0..count)
                    .map(|i| rd::rd_kafka_acl_result_error(*results.add(i)))
                    .filter(|error| !error.is_null())
                    .map(|error| {
                        CStr::from_ptr(rd::rd_kafka_error_string(error))
                            .to_string_lossy()
                            .into_owned()
                    })
                    .collect::<Vec<_>>()
            },
        );
        for binding in bindings {
            rd::rd_kafka_AclBinding_destroy(binding);
        }
        let refused = created.unwrap_or_else(|e| vec![e]);
        assert!(refused.is_empty(), "CreateAcls {grants:?}: {refused:?}");

        // The broker answers DescribeAcls from its own authorizer: once it lists them, it
        // enforces them.
        let filter = rd::rd_kafka_AclBindingFilter_new(
            rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_ANY,
            std::ptr::null(),
            rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_ANY,
            principal.as_ptr(),
            std::ptr::null(),
            rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_ANY,
            rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ANY,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        assert!(!filter.is_null(), "ACL filter");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let listed = admin_call(
                rk,
                |queue| rd::rd_kafka_DescribeAcls(rk, filter, std::ptr::null(), queue),
                |event| {
                    let mut count = 0;
                    rd::rd_kafka_DescribeAcls_result_acls(
                        rd::rd_kafka_event_DescribeAcls_result(event),
                        &mut count,
                    );
                    count
                },
            );
            if listed.as_ref().is_ok_and(|&count| count >= grants.len()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the broker does not list the ACLs of {principal:?} 30 s after they were created: {listed:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        rd::rd_kafka_AclBinding_destroy(filter);
    }
}

/// One admin request: `call` sends it with a fresh queue for its answer, `read` reads the
/// answer's event (unless the request failed as a whole).
///
/// # Safety
/// `rk` is a live client; `call` and `read` use the pointers they are given as librdkafka
/// documents.
unsafe fn admin_call<T>(
    rk: *mut rd::rd_kafka_t,
    call: impl FnOnce(*mut rd::rd_kafka_queue_t),
    read: impl FnOnce(*mut rd::rd_kafka_event_t) -> T,
) -> Result<T, String> {
    // SAFETY: the queue and event are destroyed once read, nothing kept of them.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        call(queue);
        let event = rd::rd_kafka_queue_poll(queue, 30_000);
        assert!(!event.is_null(), "an admin request: no answer within 30 s");
        let answer = if rd::rd_kafka_event_error(event)
            == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            Ok(read(event))
        } else {
            Err(CStr::from_ptr(rd::rd_kafka_event_error_string(event))
                .to_string_lossy()
                .into_owned())
        };
        rd::rd_kafka_event_destroy(event);
        rd::rd_kafka_queue_destroy(queue);
        answer
    }
}
